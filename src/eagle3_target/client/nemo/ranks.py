"""Data-parallel ranks under torchrun: each rank is its own client session, but a target weight crosses the
network once per job, not once per rank.

Rank 0 of the default process group fetches; the others receive it by broadcast over the trainer's own
group (NCCL on GPUs, gloo on CPU), so start-up does not grow with the rank count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist


def ranks() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def fetched_once(fetch: Callable[[], torch.Tensor], device: torch.device | str | None = None) -> torch.Tensor:
    """``fetch()`` on rank 0, broadcast to every rank; without a process group (or with one rank), ``fetch()``.

    Every rank must call it, in the same order, as every rank reaches NeMo's setup."""
    if ranks() == 1:
        return fetch()
    # NCCL moves device tensors only; gloo, host tensors
    carrier = torch.device(device or "cuda") if dist.get_backend() == "nccl" else torch.device("cpu")
    weight = fetch() if dist.get_rank() == 0 else None
    head = [None if weight is None else (tuple(weight.shape), weight.dtype)]
    dist.broadcast_object_list(head, src=0, device=carrier if carrier.type == "cuda" else None)
    shape, dtype = head[0]
    buffer = weight.to(carrier) if weight is not None else torch.empty(shape, dtype=dtype, device=carrier)
    dist.broadcast(buffer, src=0)
    return buffer


def fetched_weights(backend, names: Iterable[str], device: torch.device | str) -> dict[str, torch.Tensor]:
    """The target weights ``names`` on ``device``, each fetched once per job (`fetched_once`), in the
    given order: every family's one-time weights come through here, so no adapter holds rank code."""
    return {
        name: fetched_once(lambda name=name: backend.target_weight(name), device).to(device) for name in names
    }
