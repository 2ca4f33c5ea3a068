"""NeMo AutoModel 0.7.0's offline EAGLE-3 cache format (``eagle3_cache``), byte for byte.

A shard stacks its samples along dim 0: ``input_ids``, ``attention_mask``, ``loss_mask`` (int64),
``aux_hidden_states`` (the cache dtype), ``position_mask`` (bool) and the draft-vocab distribution,
either in full (``target_probs``) or as its renormalized top-k (``target_probs_values`` in the cache
dtype, ``target_probs_indices`` int32). The manifest is sorted, indented JSON with ``format_version``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import torch
from safetensors.torch import save

FORMAT_VERSION = 2
MANIFEST = "manifest.json"
VERSION_FILE = "target_version.json"  # ours, beside NeMo's files: the target version the cache was made from
EMBEDDINGS = "target_embeddings.safetensors"
SHARD = re.compile(r"^shard-(\d{6})\.safetensors$")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
COMMON_KEYS = ("input_ids", "attention_mask", "loss_mask", "aux_hidden_states", "position_mask")


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.safetensors"


def compresses(topk: int, draft_vocab: int) -> bool:
    """NeMo's rule: top-k applies only for a positive k below the draft vocabulary."""
    return 0 < topk < draft_vocab


def top_k(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest probabilities, renormalized to sum to one, and their int32 columns."""
    values, columns = torch.topk(probs, min(k, probs.shape[-1]), dim=-1)
    total = values.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(probs.dtype).tiny)
    return values / total, columns.to(torch.int32)


def batch_tensors(batch: dict[str, torch.Tensor], dtype: torch.dtype, topk: int) -> dict[str, torch.Tensor]:
    """One TargetBatch (as a dict) -> the cache's tensors for its samples, on the CPU."""
    out = {
        "input_ids": batch["input_ids"].to(torch.long).cpu(),
        "attention_mask": batch["attention_mask"].to(torch.long).cpu(),
        "loss_mask": batch["loss_mask"].to(torch.long).cpu(),
        "aux_hidden_states": batch["aux_hidden_states"].to(dtype).cpu(),
        "position_mask": batch["position_mask"].to(torch.bool).cpu(),
    }
    probs = batch["target_probs"]
    if compresses(topk, probs.shape[-1]):
        values, columns = top_k(probs, topk)
        out["target_probs_values"] = values.to(dtype).cpu()
        out["target_probs_indices"] = columns.cpu()
    else:
        out["target_probs"] = probs.to(dtype).cpu()
    return out


def shard_bytes(chunks: list[dict[str, torch.Tensor]]) -> bytes:
    """The safetensors file of one shard from its batches' tensors, in order."""
    return save({k: torch.cat([c[k] for c in chunks]).contiguous() for k in chunks[0]})


def embeddings_bytes(weight: torch.Tensor) -> bytes:
    return save({"weight": weight.detach().to(torch.float32).cpu().contiguous()})


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return json.dumps({"format_version": FORMAT_VERSION, **manifest}, indent=2, sort_keys=True).encode()


def manifest_difference(recorded: dict[str, Any], manifest: dict[str, Any]) -> list[str]:
    """The fields in which a cache's manifest differs from this run's (format_version included)."""
    recorded = dict(recorded)
    if recorded.pop("format_version", None) != FORMAT_VERSION:
        return ["format_version"]
    return sorted(k for k in recorded.keys() | manifest.keys() if recorded.get(k) != manifest.get(k))
