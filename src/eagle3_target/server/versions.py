"""Which weights a server serves: the start-up version is a digest of the weights themselves, so replicas
loaded from one checkpoint agree without being told; a refresh (refresh.py) replaces it with its label."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch

from .runners import TargetRunner

DIGEST_PREFIX = "sha256-"


def weights_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order (device tensors are read one
    at a time through host memory)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach()
        digest.update(f"{name}\0{str(tensor.dtype)}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.contiguous().cpu().reshape(-1).view(torch.uint8).numpy().data)
    return DIGEST_PREFIX + digest.hexdigest()[:16]


def start_version(runner: TargetRunner) -> str:
    """The digest of the runner's weights where it holds them (``named_weights``); an engine that keeps its
    weights to itself (vLLM, SGLang) gets the digest of its config and model name instead."""
    named = getattr(runner, "named_weights", None)
    if named is not None:
        return weights_digest(named())
    blob = f"{runner.info.model}\0{runner.info.config_digest}".encode()
    return "config-" + hashlib.sha256(blob).hexdigest()[:16]
