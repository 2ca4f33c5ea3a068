"""What the operator remembers of one target between passes: its last body, its lock, the pod writes the
watch has not shown yet, FailedMount messages, and groups given back for want of nodes."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field

from . import builders
from .kube import Children
from .planner import PodState
from .refresh import Refreshes

EXPECTATION_TTL = 60.0  # seconds to trust our own creates/deletes over a watch that has not shown them yet
MOUNT_GRACE = 10.0  # seconds in ContainerCreating before a pod's FailedMount Events are read


@dataclass
class Tracked:
    """One target as last seen, its lock, and the pod writes the watch has not reflected yet (so that two
    quick passes never act twice on one gap: controller-runtime calls these expectations)."""

    body: dict
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    created: dict[str, tuple[PodState, float]] = field(default_factory=dict)
    deleted: dict[str, float] = field(default_factory=dict)
    mounts: dict[str, str] = field(default_factory=dict)  # pod -> its volume's FailedMount message
    # groups given back for want of nodes: ordinal -> (not created again before, why)
    held: dict[int, tuple[float, str]] = field(default_factory=dict)
    # a pod event's pass waits for the lock: later pod events of this target leave it to that pass, which reads
    # the index (already holding their state) once it starts, instead of queueing one pass each
    pass_waiting: bool = False
    refreshes: Refreshes = field(default_factory=Refreshes)  # in-place weight refreshes (spec.weights)

    def wrote(self, body: dict) -> bool:
        """Whether body is the version this operator's last status write returned (so nothing new)."""
        version = body.get("metadata", {}).get("resourceVersion")
        return version is not None and version == self.body.get("metadata", {}).get("resourceVersion")

    async def read_mounts(self, pods: list[PodState], children: Children, namespace: str, now: float) -> None:
        """On full passes: what pods stuck creating their containers wait on, from their Events."""
        stuck = [p for p in pods if p.creating_since is not None and now - p.creating_since >= MOUNT_GRACE]
        self.mounts = {
            p.name: message for p in stuck if (message := await children.mount_failure(p.name, namespace))
        }

    def with_mounts(self, pods: list[PodState]) -> list[PodState]:
        def failing(p: PodState) -> PodState:
            message = self.mounts[p.name].split(" : ", 1)[-1]  # drop "MountVolume.SetUp failed for ..."
            return dataclasses.replace(p, failing_reason="FailedMount", failing_message=message)

        return [
            failing(p) if p.name in self.mounts and p.creating_since and not p.failing_reason else p
            for p in pods
        ]

    def observe(self, indexed: list[PodState], now: float) -> list[PodState]:
        seen = {p.name: p for p in indexed}
        self.created = {
            n: c for n, c in self.created.items() if n not in seen and now - c[1] < EXPECTATION_TTL
        }
        self.deleted = {
            n: t
            for n, t in self.deleted.items()
            if n in seen and not seen[n].terminating and now - t < EXPECTATION_TTL
        }
        leaving = {n: builders.TERMINATION_GRACE_SECONDS + t for n, t in self.deleted.items()}
        pods = [
            dataclasses.replace(p, terminating=True, deadline=leaving[p.name]) if p.name in leaving else p
            for p in indexed
        ]
        return pods + [state for state, _ in self.created.values()]
