"""Rank 0 leading a split replica's calls, and the other ranks following them (the hf and sglang engines).

Rank 0 is the runner the server sees: before each call it broadcasts the call's name and arguments, and
every rank runs it, so the collectives inside the forward line up. Tensors travel on the CPU and each rank
takes them to its own device; what comes back is whole (a sharded DTensor is gathered).
"""

from __future__ import annotations

import dataclasses
import logging

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ..parallel import ParallelLayout
from ..ranks import RankGroup
from .base import Captured, ForwardInputs, RunnerInfo

log = logging.getLogger(__name__)
STOP = None  # the command that ends the followers' loop


def whole(value):
    """A DTensor gathered to one plain tensor (a collective: every rank calls it); anything else as is."""
    if isinstance(value, DTensor):
        return value.full_tensor()
    if isinstance(value, Captured):
        return Captured(*(whole(getattr(value, f.name)) for f in dataclasses.fields(Captured)))
    if isinstance(value, tuple):
        return tuple(whole(v) for v in value)
    return value


def moved(value, device):
    """Call arguments on ``device``: rank 0 sends them from the CPU, each rank takes them to its own."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, ForwardInputs):
        return ForwardInputs(*(moved(getattr(value, f.name), device) for f in dataclasses.fields(value)))
    if isinstance(value, tuple):
        return tuple(moved(v, device) for v in value)
    if isinstance(value, dict):
        return {k: moved(v, device) for k, v in value.items()}
    return value


def run_call(runner, call, device):
    """One broadcast call (name, args, kwargs) on this rank's runner, its result whole."""
    name, args, kwargs = call
    return whole(getattr(runner, name)(*moved(args, device), **moved(kwargs, device)))


class LeadingRunner:
    """Rank 0 of a split replica (hf or sglang): the server's runner. Each call is run by every rank; tensors
    travel on the CPU and each rank takes them to its own device."""

    def __init__(self, inner, group: RankGroup, layout: ParallelLayout):
        self.inner, self.group = inner, group
        self.info: RunnerInfo = dataclasses.replace(inner.info, parallel=layout.describe())
        self._device = inner.info.device

    def _everywhere(self, name: str, *args, **kwargs):
        dist.broadcast_object_list([(name, moved(args, "cpu"), moved(kwargs, "cpu"))], src=0)
        return run_call(self.inner, (name, args, kwargs), self._device)

    def healthy(self) -> bool:
        """False once any rank of the replica is gone (ranks.py's watchdog)."""
        return self.group.dead is None

    def close(self) -> None:
        if dist.is_initialized() and self.group.dead is None:
            dist.broadcast_object_list([STOP], src=0)
        self.group.stop_children()
        self.inner.close()


def follow_calls(group: RankGroup, runner, device: str) -> None:
    """Run every call rank 0 broadcasts on this rank's ``runner``, until it says stop."""
    try:
        while True:
            box = [None]
            dist.broadcast_object_list(box, src=0)
            if box[0] is STOP:
                return
            try:
                run_call(runner, box[0], device)
            except Exception:  # noqa: BLE001 - rank 0 met the same error and answers the client
                log.debug("rank %d: call %s failed as on rank 0", group.rank, box[0][0], exc_info=True)
    finally:
        group.stop_children()
