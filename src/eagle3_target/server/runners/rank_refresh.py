"""A split hf replica's refresh (tensor or pipeline parallel, one node or several): every rank reads and
checks its own part of the source, then every rank swaps, or none does.

Phase one (rank 0's ``begin_staging``, one short broadcast call, leading.py): every rank starts reading the
source itself, in a thread of its own, while the old weights keep serving. It checks the source against the
whole model's layout (names, shapes, kinds, config), reads only what it holds (a tensor-parallel rank the
block of each sharded tensor it holds, as a slice of the file; a pipeline stage its own tensors), checks that
for NaN, and leaves its outcome in the replica's rendezvous store. Rank 0 waits for every rank's outcome off
the model thread (``wait_outcomes``). Phase two, one broadcast call on the model thread between two forwards:
every rank copies its part into the tensors it serves when every outcome was good, or drops it when any rank
refused, so no rank swaps and the old weights keep serving.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from ..errors import InvalidInput, NotReady, ServiceError
from ..ranks import RankGroup
from ..weight_source import read_source

log = logging.getLogger(__name__)

OUTCOME_KEY = "refresh/{}/{}"  # a refresh's ticket and a rank: that rank's outcome, as JSON ({} when staged)
POLL_S = 0.05


def block(tensor: torch.Tensor) -> tuple[slice, ...] | None:
    """The block of the whole checkpoint tensor this rank holds: a DTensor's local shard; None, all of it."""
    if not isinstance(tensor, DTensor):
        return None
    odd = [p for p in tensor.placements if type(p) not in (Shard, Replicate)]
    if odd:
        raise InvalidInput(
            "refresh_not_offered",
            f"a tensor is sharded as {odd[0]}, not in blocks: this replica cannot read its part of a checkpoint",
        )
    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    return tuple(slice(start, start + size) for start, size in zip(offset, shape, strict=True))


def local(tensor: torch.Tensor) -> torch.Tensor:
    """What this rank holds of a served tensor: a DTensor's shard (its own storage), a plain tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class RankRefresh:
    """A rank's runner (an HFRunner or a pipeline stage, offering ``served_parts``) and the two phases of a
    refresh on that rank; every other call goes to the runner."""

    def __init__(self, runner, group: RankGroup):
        self.runner, self.group = runner, group
        self._staging: tuple[int, threading.Thread, dict[str, torch.Tensor]] | None = None

    def __getattr__(self, name: str):
        return getattr(self.runner, name)

    def stage_weights(self, source: str, ticket: int) -> None:
        """Phase one: start reading this rank's part of ``source`` (its outcome goes to the store)."""
        layout, held = self.runner.served_parts()
        staged: dict[str, torch.Tensor] = {}
        thread = threading.Thread(
            target=self._stage,
            args=(source, ticket, layout, held, staged),
            name=f"rank-{self.group.rank}-refresh",
            daemon=True,
        )
        self._staging = (ticket, thread, staged)
        thread.start()

    def _stage(self, source: str, ticket: int, layout: dict, held: dict, staged: dict) -> None:
        try:
            parts = {name: block(tensor) for name, tensor in held.items()}
            staged.update(read_source(source, layout, self.runner.info.config_digest, parts))
            outcome = {}
        except ServiceError as exc:
            outcome = {"error": exc.error, "detail": exc.detail}
        except Exception as exc:  # noqa: BLE001 - any failure is this rank's refusal, told to rank 0
            log.exception("rank %d: staging %s failed", self.group.rank, source)
            outcome = {"error": "refresh_failed", "detail": f"{type(exc).__name__}: {exc}"[:300]}
        self.group.store.set(OUTCOME_KEY.format(ticket, self.group.rank), json.dumps(outcome))

    @torch.no_grad()
    def commit_weights(self, ticket: int, swap: bool) -> None:
        """Phase two: this rank's staged part copied into what it serves (``swap``), or dropped."""
        staging, self._staging = self._staging, None
        if staging is None or staging[0] != ticket:
            raise RuntimeError(f"rank {self.group.rank} staged no refresh {ticket}")
        _, thread, staged = staging
        thread.join()
        if swap:
            _, held = self.runner.served_parts()
            for name, tensor in staged.items():
                local(held[name]).copy_(tensor)


def wait_outcomes(group: RankGroup, ticket: int) -> None:
    """Until every rank has staged its part of refresh ``ticket`` (off the model thread); the first refusal,
    in rank order and naming its rank, is raised."""
    world = group.spec.world_size
    keys = [OUTCOME_KEY.format(ticket, rank) for rank in range(world)]
    while not group.store.check(keys):
        if group.dead is not None:
            raise NotReady("rank_lost", f"the replica lost a rank while it staged the refresh: {group.dead}")
        time.sleep(POLL_S)
    outcomes = [json.loads(group.store.get(key)) for key in keys]
    for key in keys:
        group.store.delete_key(key)
    for rank, outcome in enumerate(outcomes):
        if outcome:
            kind = ServiceError if outcome["error"] == "refresh_failed" else InvalidInput
            raise kind(outcome["error"], f"rank {rank} of {world}: {outcome['detail']}")
