"""`eagle3-target precompute --family dspark`: NeMo's offline DSpark cache, written by the target fleet.

The files are the ones NeMo's ``precompute_dspark`` writes (manifest.json, shard-NNNNNN.safetensors,
target_weights.safetensors), built with NeMo's own manifest and cache-tensor functions; the fleet captures
the target layers and the post-norm hidden state (client/nemo/captures.py puts them in NeMo's layout) and
hands out the embeddings and lm_head. Workers, resume and object storage as for EAGLE-3's cache (runner.py).
The manifest says ``"complete": true`` once every shard is there, whichever worker writes the last one.
"""

from __future__ import annotations

import argparse
import collections
import json
from types import SimpleNamespace
from typing import Any

import torch
from safetensors.torch import save

from eagle3_target.protocol.families import family
from eagle3_target.protocol.features import WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD

from ..inputs import BatchInputs
from ..nemo._imports import nemo_module
from ..nemo.captures import dspark_context
from . import cache, data, runner
from .options import UsageError
from .progress import Progress
from .runner import check_model, check_output, connect, log, plan, record_version, shard_len
from .store import CacheStore

WEIGHTS = "target_weights.safetensors"
# NeMo's precompute_dspark refuses these: DeepSeek V4 and GLM-5.2 have its distributed precompute; MiniMax M3
# VL has none in 0.7.0 (its cache schema is text-only), only the online multimodal recipe.
DISTRIBUTED_MODEL_TYPES = ("deepseek_v4", "glm_moe_dsa")
ONLINE_ONLY_MODEL_TYPES = ("minimax_m3_vl",)


def nemo_dspark():
    return (
        nemo_module("components.datasets.llm.dspark_cache"),
        nemo_module("components.speculative.dspark.registry"),
        nemo_module("components.speculative.dspark.target_utils"),
        nemo_module("components.speculative.dspark.common"),
    )


def manifest_bytes(dspark_cache, manifest: dict[str, Any], complete: bool) -> bytes:
    """NeMo's write_manifest: sorted, indented JSON with its format_version and the ``complete`` mark."""
    doc = {"format_version": dspark_cache._FORMAT_VERSION, **manifest, "complete": complete}
    return json.dumps(doc, indent=2, sort_keys=True).encode()


def check_manifest(
    dspark_cache, store: CacheStore, manifest: dict[str, Any], present: set[int], args
) -> bool:
    """runner.check_manifest with NeMo's DSpark fields; returns whether the recorded manifest says complete."""

    def difference(recorded: dict[str, Any], manifest: dict[str, Any]) -> list[str]:
        wrong = dspark_cache.manifest_mismatch_fields(recorded, manifest)
        if recorded.get("format_version") != dspark_cache._FORMAT_VERSION:
            wrong = ["format_version", *wrong]
        return wrong

    recorded = runner.check_manifest(store, manifest, present, args, difference)
    return recorded is not None and recorded.get("complete") is True


def target_config(args, target_utils):
    from transformers import AutoConfig

    model_type = target_utils.read_target_model_type(args.target_model, args.trust_remote_code)
    if model_type in DISTRIBUTED_MODEL_TYPES:
        raise UsageError(
            f"--family dspark: a {model_type} target is precomputed by NeMo's distributed path, "
            "not by precompute_dspark"
        )
    if model_type in ONLINE_ONLY_MODEL_TYPES:
        raise UsageError(
            f"--family dspark: a {model_type} target has no offline cache in NeMo 0.7.0 (its DSpark cache is "
            "text-only): train online with recipe_args.multimodal: true"
        )
    config = AutoConfig.from_pretrained(args.target_model, trust_remote_code=args.trust_remote_code)
    text = config.text_config if model_type in target_utils.GEMMA4_MODEL_TYPES else config
    return model_type, config, text


def build_manifest(args, dspark_cache, model_type, text, num_samples, layer_ids, tokenizer) -> dict[str, Any]:
    """NeMo's DSpark manifest, from the same inputs NeMo takes it from."""
    return dspark_cache.build_cache_manifest(
        target_model=args.target_model,
        target_model_type=model_type,
        target_text_config=text,
        seq_length=args.seq_length,
        dtype=args.dtype,
        num_samples=num_samples,
        shard_size=args.shard_size,
        target_layer_ids=list(layer_ids),
        train_data_path=str(args.input_data),
        train_split=args.split,
        shuffle_seed=int(args.shuffle_seed),
        mask_reasoning_content=bool(args.mask_reasoning_content),
        chat_template_sha256=dspark_cache.tokenizer_chat_template_sha256(tokenizer),
        mask_generation_prompt=bool(args.mask_generation_prompt),
    )


def weights_bytes(backend, dtype: torch.dtype) -> bytes:
    """NeMo's target_weights.safetensors: the fleet's embeddings and lm_head in the cache dtype."""
    weights = {
        "embed_tokens.weight": backend.target_weight(WEIGHT_INPUT_EMBEDDINGS),
        "lm_head.weight": backend.target_weight(WEIGHT_LM_HEAD),
    }
    return save({k: v.detach().to(dtype).cpu().contiguous() for k, v in weights.items()})


def write_shards(backend, loader_data, todo, layer_ids, num_layers, store, args, progress, dspark_cache):
    """Stream the batches of ``todo`` through the fleet and write each shard once its last batch is back."""
    dtype = cache.DTYPES[args.dtype]
    shard_of = [s for s in todo for _ in range(-(-shard_len(s, loader_data, args) // args.batch_size))]
    sent: collections.deque = collections.deque()  # the batches whose replies are still to come, in order

    def inputs():
        for batch in data.batches(loader_data, todo, args.shard_size):
            sent.append(batch)
            yield BatchInputs(batch["input_ids"], batch["attention_mask"], batch["loss_mask"])

    chunks: list[dict[str, torch.Tensor]] = []
    for position, captured in enumerate(backend.prefetch_captures(inputs())):
        batch = sent.popleft()
        target_batch = SimpleNamespace(
            input_ids=batch["input_ids"],
            loss_mask=batch["loss_mask"],
            target_hidden_states=dspark_context(captured, layer_ids, num_layers),
            target_last_hidden_states=captured["final_hidden"],
        )
        chunks.append(dspark_cache.compute_batch_cache(target_batch, dtype))
        progress.batch(batch["input_ids"].shape[0], int(batch["attention_mask"].sum()))
        if position + 1 == len(shard_of) or shard_of[position + 1] != shard_of[position]:
            blob = save({k: torch.cat([c[k] for c in chunks]).contiguous() for k in dspark_cache.CACHE_KEYS})
            store.write(cache.shard_name(shard_of[position]), blob)
            progress.shard(len(blob))
            chunks = []


def precompute_dspark(args: argparse.Namespace, token: str | None) -> Progress:
    store = CacheStore(args.output_dir)
    present = check_output(store, args)
    dspark_cache, registry, target_utils, common = nemo_dspark()
    model_type, config, text = target_config(args, target_utils)
    num_layers = int(text.num_hidden_layers)
    layer_ids = list(
        args.target_layer_ids or registry.build_target_layer_ids(num_layers, args.draft_num_hidden_layers)
    )
    layer_ids = common.validate_target_layer_ids(layer_ids, num_layers)
    tokenizer_module, _ = data.nemo_modules()
    tokenizer = tokenizer_module.NeMoAutoTokenizer.from_pretrained(
        args.target_model, trust_remote_code=args.trust_remote_code
    )
    target_utils.apply_target_chat_template(tokenizer, args.chat_template)
    if args.target_attn_implementation is not None or args.target_force_hf:
        log.warning("--target-attn-implementation and --target-force-hf: the fleet's servers load the target")
    features = family("dspark").ask(layer_ids, num_layers)
    with connect(args, token, features) as backend:
        check_model(backend.model_info(), config if text is config else text, args)
        loader_data = data.Dataset(data.nemo_loader(args, tokenizer))
        manifest = build_manifest(
            args, dspark_cache, model_type, text, loader_data.num_samples, layer_ids, tokenizer
        )
        complete = False
        if args.resume or args.worker_count > 1:
            complete = check_manifest(dspark_cache, store, manifest, present, args)
        record_version(store, backend.target_version, args)
        if not complete:
            store.write(cache.MANIFEST, manifest_bytes(dspark_cache, manifest, complete=False))
        store.write(WEIGHTS, weights_bytes(backend, cache.DTYPES[args.dtype]))
        todo, progress = plan(loader_data, present, args, "DSpark shards")
        try:
            write_shards(
                backend, loader_data, todo, layer_ids, num_layers, store, args, progress, dspark_cache
            )
        finally:
            progress.close()
        total = -(-loader_data.num_samples // args.shard_size)
        if len(store.shard_indices()) == total:
            store.write(cache.MANIFEST, manifest_bytes(dspark_cache, manifest, complete=True))
    return progress
