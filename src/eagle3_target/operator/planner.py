"""Which pod to create or delete next: scaling, healing, abandoning pods stuck on dead nodes, and
Deployment-like rollouts over ordinals. Pure functions of the observed pods."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from .builders import HASH_ANNOTATION, ORDINAL_LABEL, pod_name
from .groups import GROUP_LABEL, RANK_LABEL
from .weights import READINESS_GATE, served_version

# Waiting reasons that will not fix themselves while the spec stays as it is: Stalled, Degraded.
FAILING_REASONS = {
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "InvalidImageName",
    "Unschedulable",
    "FailedMount",  # a Secret, ConfigMap or claim a volume names is missing (from the pod's Events)
}


def parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.datetime.fromisoformat(value).timestamp()  # Python >= 3.11 reads the "Z" suffix


def _creating_since(waiting: list[dict], scheduled: dict) -> float | None:
    if any(w.get("reason") == "ContainerCreating" for w in waiting) and scheduled.get("status") == "True":
        return parse_time(scheduled.get("lastTransitionTime"))
    return None


def _failure_tolerations(tolerations: list[dict]) -> tuple[tuple[str, float | None], ...]:
    found: dict[str, float | None] = {}
    for t in tolerations:
        if t.get("effect") in (None, "", "NoExecute") and t.get("key"):
            found[t["key"]] = t.get("tolerationSeconds")
    return tuple(sorted(found.items()))


@dataclass(frozen=True)
class PodState:
    """What the operator needs to know about one target pod (this is what the kopf index stores)."""

    name: str
    ordinal: int
    spec_hash: str
    ready: bool
    ip: str | None
    http_port: int | None
    phase: str
    terminating: bool
    failing_reason: str | None
    failing_message: str = ""
    deadline: float | None = None  # when a terminating pod should have been gone (its deletionTimestamp)
    node: str | None = None
    # seconds the pod tolerates each NoExecute node-failure taint; None: forever
    node_tolerations: tuple[tuple[str, float | None], ...] = ()
    creating_since: float | None = None  # scheduled, containers not yet created (volumes mount first)
    group: str = ""  # with nodesPerReplica > 1: the group's (its leader's) name
    rank: int = 0
    created_at: float | None = None
    bound: bool = True  # scheduled to a node
    # its server answers (containers ready), though a readiness gate may keep it out of the endpoints
    serving: bool = False
    target_version: str = ""  # the weights version it serves, as far as the operator knows ("" unknown)
    restarts: int = 0  # the server container's restart count
    gated: bool = False  # has the weights readiness gate (created while spec.weights was set)

    @property
    def group_name(self) -> str:
        return self.group or self.name

    @classmethod
    def from_pod(cls, body: dict[str, Any]) -> PodState:
        meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status") or {}
        labels = meta.get("labels", {})
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        ports = [
            p for c in spec.get("containers", [])[:1] for p in c.get("ports", []) if p.get("name") == "http"
        ]
        waiting = [(s.get("state") or {}).get("waiting") or {} for s in status.get("containerStatuses") or []]
        scheduled = conditions.get("PodScheduled", {})
        if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
            waiting.append(scheduled)
        failing = next((w for w in waiting if w.get("reason") in FAILING_REASONS), {})
        phase = status.get("phase", "Pending")
        server = (status.get("containerStatuses") or [{}])[0]
        serving = any(conditions.get(c, {}).get("status") == "True" for c in ("Ready", "ContainersReady"))
        if phase == "Failed":
            failing = {"reason": status.get("reason") or "PodFailed", "message": status.get("message", "")}
        return cls(
            name=meta["name"],
            ordinal=int(labels.get(ORDINAL_LABEL, -1)),
            spec_hash=meta.get("annotations", {}).get(HASH_ANNOTATION, ""),
            ready=conditions.get("Ready", {}).get("status") == "True" and bool(status.get("podIP")),
            ip=status.get("podIP"),
            http_port=ports[0]["containerPort"] if ports else None,
            phase=phase,
            terminating=bool(meta.get("deletionTimestamp")),
            failing_reason=failing.get("reason"),
            failing_message=failing.get("message") or "",
            deadline=parse_time(meta.get("deletionTimestamp")),
            node=spec.get("nodeName"),
            node_tolerations=_failure_tolerations(spec.get("tolerations") or []),
            creating_since=_creating_since(waiting, scheduled),
            group=labels.get(GROUP_LABEL, ""),
            rank=int(labels.get(RANK_LABEL, 0)),
            created_at=parse_time(meta.get("creationTimestamp")),
            bound=bool(spec.get("nodeName")),
            serving=serving and bool(status.get("podIP")),
            target_version=served_version(meta.get("annotations", {}), int(server.get("restartCount", 0))),
            restarts=int(server.get("restartCount", 0)),
            gated=any(g.get("conditionType") == READINESS_GATE for g in spec.get("readinessGates") or ()),
        )

    @property
    def endpoint(self) -> str | None:
        if not (self.ready and self.ip and self.http_port):
            return None
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"{host}:{self.http_port}"

    def abandoned(self, now: float, grace: float) -> bool:
        """Terminating for longer than the grace period past its deadline: its node is most likely gone, and
        the pod no longer holds its ordinal."""
        return self.terminating and (self.deadline or 0) + grace <= now


@dataclass(frozen=True)
class Rollout:
    """The desired state: how many replicas, at which revision, and how fast to change pods over."""

    replicas: int
    revision: str
    max_surge: int = 0
    max_unavailable: int = 1
    partition: int = 0  # only ordinals >= partition are updated

    def wants_update(self, pod: PodState) -> bool:
        return pod.ordinal >= self.partition and pod.spec_hash != self.revision


@dataclass
class Plan:
    """One reconcile step: pods to create (ordinal, name) and pods to delete (names)."""

    create: list[tuple[int, str]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)


def free_name(target: str, ordinal: int, taken: set[str]) -> str:
    """`<target>-<ordinal>`, or `<target>-<ordinal>-r<n>` while that name is still held by a leaving pod or
    by the pod a surge replaces."""
    candidate, n = pod_name(target, ordinal), 0
    while candidate in taken:
        n += 1
        candidate = f"{pod_name(target, ordinal)}-r{n}"
    return candidate


def plan(target: str, pods: list[PodState], rollout: Rollout, now=0.0, grace=300.0, lost=frozenset()) -> Plan:
    """Deployment semantics over ordinals: never more than replicas + maxSurge pods (a pod still terminating
    holds its GPU, so it counts until abandoned) and never fewer than replicas - maxUnavailable ready ones.
    `lost` pods (on a dead node) count as gone at once; their names stay taken until the API drops them."""
    result, taken = Plan(), {p.name for p in pods}
    live = [p for p in pods if not p.terminating and p.name not in lost]
    leaving = [p for p in pods if p.terminating and not p.abandoned(now, grace) and p.name not in lost]
    extras = sorted((p for p in live if not 0 <= p.ordinal < rollout.replicas), key=lambda p: -p.ordinal)
    finished = [p for p in live if 0 <= p.ordinal < rollout.replicas and p.phase in ("Failed", "Succeeded")]
    result.delete += [p.name for p in extras + finished]
    kept = [p for p in live if p not in extras and p not in finished]
    by_ordinal: dict[int, list[PodState]] = {}
    for p in kept:
        by_ordinal.setdefault(p.ordinal, []).append(p)
    blocked = {p.ordinal for p in leaving}  # wait for it: it still holds the GPU and the ports

    def create(ordinal: int) -> None:
        name = free_name(target, ordinal, taken)
        taken.add(name)
        result.create.append((ordinal, name))

    for ordinal in range(rollout.replicas):
        if ordinal not in by_ordinal and ordinal not in blocked:
            create(ordinal)
    total = len(kept) + len(leaving) + len(result.create)
    ready = sum(p.ready for p in kept)
    min_ready = rollout.replicas - rollout.max_unavailable

    def delete(victims: list[PodState], replaced: bool) -> bool:
        """`replaced`: the ordinal gets a new pod in its place next pass, which the total counts already."""
        nonlocal total, ready
        cost = sum(p.ready for p in victims)
        if cost and ready - cost < min_ready:
            return False
        result.delete += [p.name for p in victims]
        total, ready = total - (len(victims) - replaced), ready - cost
        return True

    # an ordinal whose new pod is ready lets its old pods go
    for group in by_ordinal.values():
        keeper = next((p for p in group if p.ready and not rollout.wants_update(p)), None)
        if keeper is not None and len(group) > 1:
            delete([p for p in group if p is not keeper], replaced=False)

    outdated = [
        group
        for ordinal, group in by_ordinal.items()
        if ordinal not in blocked and all(rollout.wants_update(p) for p in group)
    ]
    # unready old pods cost no availability, so they go first; then the highest ordinal (as StatefulSets)
    outdated.sort(key=lambda group: (any(p.ready for p in group), -group[0].ordinal))
    for group in outdated:
        if not any(p.ready for p in group):
            delete(group, replaced=True)
        elif total < rollout.replicas + rollout.max_surge:
            create(group[0].ordinal)
            total += 1
        elif not delete(group, replaced=True):
            break
    return result
