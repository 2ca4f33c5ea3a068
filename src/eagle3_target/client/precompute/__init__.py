"""`eagle3-target precompute`: NeMo AutoModel's offline caches, written by the target fleet: EAGLE-3's
(eagle3.py, the default) and any other family's that declares one (``--family dspark``: dspark.py).

The cache is the one NeMo's ``precompute_eagle3`` writes (manifest.json, shard-NNNNNN.safetensors,
target_embeddings.safetensors) and its recipe reads with ``recipe_args.cached_target_path``; the
supervision comes from the fleet through the client, so every server is kept busy.

Modules: ``options`` (flags and their checks), ``cache`` (the cache's tensors and manifest),
``store`` (atomic files on any fsspec filesystem), ``data`` (dataset -> this worker's batches),
``progress`` (bar, log lines, Prometheus counters), ``runner`` (the steps every cache's run shares),
``eagle3`` and ``dspark`` (each family's cache), ``cli`` (the command, which finds the family's cache in
client/nemo/registry.py).
"""
