"""`eagle3-target precompute` (the default, ``--family eagle3``): NeMo's offline EAGLE-3 cache, written by the
target fleet; the shared steps are runner.py's."""

from __future__ import annotations

import argparse
from typing import Any

from . import cache, data
from .progress import Progress
from .runner import (
    check_manifest,
    check_model,
    check_output,
    connect,
    log,
    plan,
    record_version,
    shard_len,
)
from .store import CacheStore


def build_manifest(args, dataset: data.Dataset, config, aux_layer_ids: list[int]) -> dict[str, Any]:
    """NeMo's manifest fields, from the same inputs NeMo takes them from."""
    return {
        "target_model": args.target_model,
        "target_vocab_size": int(config.vocab_size),
        "draft_vocab_size": int(dataset.selected_token_ids.numel()),
        "seq_length": args.seq_length,
        "dtype": args.dtype,
        "num_samples": dataset.num_samples,
        "shard_size": args.shard_size,
        "target_probs_topk": args.target_probs_topk,
        "aux_hidden_dim": int(config.hidden_size) * len(aux_layer_ids),
        "aux_layer_ids": aux_layer_ids,
        "selected_token_ids": dataset.selected_token_ids.tolist(),
        "input_data": str(args.input_data),
        "split": args.split,
        "shuffle_seed": int(args.shuffle_seed),
        "mask_reasoning_content": bool(args.mask_reasoning_content),
        "mask_generation_prompt": bool(args.mask_generation_prompt),
    }


def write_shards(backend, dataset: data.Dataset, todo: list[int], store: CacheStore, args, progress) -> None:
    """Stream the batches of ``todo`` through the fleet (prefetch keeps every server busy) and write each
    shard as soon as its last batch is back: at most one shard is held in memory."""
    dtype = cache.DTYPES[args.dtype]
    shard_of = [s for s in todo for _ in range(-(-shard_len(s, dataset, args) // args.batch_size))]
    triples = (
        (b["input_ids"], b["attention_mask"], b["loss_mask"])
        for b in data.batches(dataset, todo, args.shard_size)
    )
    chunks: list = []
    for position, batch in enumerate(backend.prefetch(triples)):
        chunks.append(cache.batch_tensors(batch.as_dict(), dtype, args.target_probs_topk))
        progress.batch(batch.input_ids.shape[0], int(batch.attention_mask.sum()))
        shard = shard_of[position]
        if position + 1 == len(shard_of) or shard_of[position + 1] != shard:
            blob = cache.shard_bytes(chunks)
            store.write(cache.shard_name(shard), blob)
            progress.shard(len(blob))
            log.debug("wrote %s (%d bytes)", cache.shard_name(shard), len(blob))
            chunks = []


def precompute_eagle3(args: argparse.Namespace, token: str | None) -> Progress:
    """NeMo's offline EAGLE-3 cache; returns the run's closed Progress. UsageError for bad input."""
    from transformers import AutoConfig

    store = CacheStore(args.output_dir)
    present = check_output(store, args)
    data.nemo_modules()  # NeMo missing: said before the fleet is asked anything
    # The top-level config, as NeMo's manifest and the server's model_info read it.
    config = AutoConfig.from_pretrained(args.target_model, trust_remote_code=args.trust_remote_code)
    with connect(args, token) as backend:
        aux_layer_ids = check_model(backend.model_info(), config, args)
        if args.encoding == "hidden":
            log.warning("--encoding hidden: target_probs are approximate, not NeMo's")
        dataset = data.load(args, int(config.vocab_size))
        manifest = build_manifest(args, dataset, config, aux_layer_ids)
        if args.resume or args.worker_count > 1:
            check_manifest(store, manifest, present, args)
        record_version(store, backend.target_version, args)
        backend.set_vocab_mapping(dataset.selected_token_ids, dataset.selected_token_mask)
        store.write(cache.MANIFEST, cache.manifest_bytes(manifest))
        store.write(cache.EMBEDDINGS, cache.embeddings_bytes(backend.get_input_embeddings().weight))
        todo, progress = plan(dataset, present, args, "shards")
        try:
            write_shards(backend, dataset, todo, store, args, progress)
        finally:
            progress.close()
    return progress
