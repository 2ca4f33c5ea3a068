"""Pure decisions over observed pods: which pod to create or delete next (scaling, healing, one-at-a-time
rollout) and the status block with conditions whose lastTransitionTime moves only when their status flips."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from .builders import HASH_ANNOTATION, ORDINAL_LABEL

# Waiting reasons that will not fix themselves while the spec stays as it is.
FAILING_REASONS = {
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "InvalidImageName",
}


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

    @classmethod
    def from_pod(cls, body: dict[str, Any]) -> PodState:
        meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status") or {}
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        ports = [
            p for c in spec.get("containers", [])[:1] for p in c.get("ports", []) if p.get("name") == "http"
        ]
        waiting = [
            (s.get("state") or {}).get("waiting", {}).get("reason")
            for s in status.get("containerStatuses") or []
        ]
        failing = next((r for r in waiting if r in FAILING_REASONS), None)
        phase = status.get("phase", "Pending")
        if phase == "Failed":
            failing = status.get("reason") or "PodFailed"
        return cls(
            name=meta["name"],
            ordinal=int(meta.get("labels", {}).get(ORDINAL_LABEL, -1)),
            spec_hash=meta.get("annotations", {}).get(HASH_ANNOTATION, ""),
            ready=conditions.get("Ready") == "True" and bool(status.get("podIP")),
            ip=status.get("podIP"),
            http_port=ports[0]["containerPort"] if ports else None,
            phase=phase,
            terminating=bool(meta.get("deletionTimestamp")),
            failing_reason=failing,
        )

    @property
    def endpoint(self) -> str | None:
        if not (self.ready and self.ip and self.http_port):
            return None
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"{host}:{self.http_port}"


@dataclass
class Plan:
    """One reconcile step. Creations are always safe (missing ordinals); deletions are extras (highest
    ordinal first), finished pods, and at most one outdated pod when every up-to-date pod is ready."""

    create: list[int] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)


def plan(pods: list[PodState], replicas: int, hashes: dict[int, str]) -> Plan:
    """`hashes[ordinal]` is the desired spec hash of each wanted ordinal (0 .. replicas-1)."""
    result = Plan()
    live = [p for p in pods if not p.terminating]
    by_ordinal = {p.ordinal: p for p in live}
    result.delete += [p.name for p in sorted(live, key=lambda p: -p.ordinal) if not 0 <= p.ordinal < replicas]
    finished = [p for p in live if 0 <= p.ordinal < replicas and p.phase in ("Failed", "Succeeded")]
    result.delete += [p.name for p in finished]
    blocked = {p.ordinal for p in pods if p.terminating}  # a pod name is free only once the old pod is gone
    result.create = [i for i in range(replicas) if i not in by_ordinal and i not in blocked]

    wanted = [by_ordinal[i] for i in range(replicas) if i in by_ordinal and by_ordinal[i] not in finished]
    outdated = [p for p in wanted if p.spec_hash != hashes[p.ordinal]]
    settled = len(wanted) == replicas and all(p.ready for p in wanted if p.spec_hash == hashes[p.ordinal])
    if outdated and settled and not blocked:
        # a not-ready outdated pod costs no availability, so it goes first; then the highest ordinal
        victim = max(outdated, key=lambda p: (not p.ready, p.ordinal))
        result.delete.append(victim.name)
    return result


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(type_: str, status: bool, reason: str, message: str, generation: int | None) -> dict:
    result = {"type": type_, "status": "True" if status else "False", "reason": reason, "message": message}
    if generation is not None:
        result["observedGeneration"] = generation
    return result


def merge_conditions(previous: list[dict] | None, current: list[dict], timestamp: str) -> list[dict]:
    """Carry each condition's lastTransitionTime over unless its status flipped."""
    old = {c.get("type"): c for c in previous or []}
    merged = []
    for cond in current:
        before = old.get(cond["type"])
        unchanged = (
            before is not None and before.get("status") == cond["status"] and before.get("lastTransitionTime")
        )
        merged.append(
            {**cond, "lastTransitionTime": before["lastTransitionTime"] if unchanged else timestamp}
        )
    return merged


def conditions(
    pods: list[PodState], replicas: int, hashes: dict[int, str], problems: list[str], generation: int | None
) -> list[dict]:
    if problems:
        message = "; ".join(problems)
        return [
            condition("Ready", False, "InvalidSpec", message, generation),
            condition("Progressing", False, "InvalidSpec", message, generation),
            condition("Degraded", True, "InvalidSpec", message, generation),
            *kstatus_conditions(
                ready=False, stalled=True, reason="InvalidSpec", message=message, generation=generation
            ),
        ]
    live = [p for p in pods if not p.terminating]
    wanted = [p for p in live if 0 <= p.ordinal < replicas]
    ready = [p for p in wanted if p.ready]
    outdated = [p for p in wanted if p.spec_hash != hashes.get(p.ordinal)]
    failing = [p for p in live if p.failing_reason]
    counts = f"{len(ready)}/{replicas} targets ready"

    if replicas == 0:
        ready_cond = condition("Ready", True, "ScaledToZero", "no targets requested", generation)
    elif len(ready) == replicas and not outdated:
        ready_cond = condition("Ready", True, "AllTargetsReady", counts, generation)
    elif len(wanted) < replicas or any(p.phase == "Pending" for p in wanted):
        ready_cond = condition("Ready", False, "PodsStarting", counts, generation)
    elif outdated:
        ready_cond = condition("Ready", False, "RollingUpdate", counts, generation)
    else:
        ready_cond = condition("Ready", False, "ModelLoading", counts, generation)

    if len(live) != replicas:
        progressing = condition(
            "Progressing", True, "Scaling", f"{len(live)} pods, {replicas} wanted", generation
        )
    elif outdated:
        progressing = condition(
            "Progressing", True, "RollingUpdate", f"{len(outdated)} pods to replace", generation
        )
    elif len(ready) < replicas:
        progressing = condition("Progressing", True, "ModelLoading", counts, generation)
    else:
        progressing = condition("Progressing", False, "RolloutComplete", counts, generation)

    if failing:
        names = ", ".join(f"{p.name}: {p.failing_reason}" for p in failing)
        degraded = condition("Degraded", True, "PodsFailing", names, generation)
    else:
        degraded = condition("Degraded", False, "AsExpected", "no failing targets", generation)
    ready = ready_cond["status"] == "True"
    return [
        ready_cond,
        progressing,
        degraded,
        *kstatus_conditions(
            ready=ready, stalled=False, reason=ready_cond["reason"], message=counts, generation=generation
        ),
    ]


def kstatus_conditions(
    *, ready: bool, stalled: bool, reason: str, message: str, generation: int | None
) -> list[dict]:
    """kstatus's abnormal-true pair, which `helm install --wait` (Helm 4) and Flux read for custom resources:
    Reconciling while the fleet is not yet Ready, Stalled when it never will be without a spec change."""
    return [
        condition("Reconciling", not ready and not stalled, reason, message, generation),
        condition("Stalled", stalled, reason if stalled else "AsExpected", message, generation),
    ]


def compute_status(
    *,
    name: str,
    pods: list[PodState],
    replicas: int,
    hashes: dict[int, str],
    problems: list[str],
    generation: int | None,
    selector: str,
    previous: dict | None,
    timestamp: str | None = None,
) -> dict:
    """The whole status block; equal input gives an equal block (so an unchanged status is not re-patched)."""
    live = [p for p in pods if not p.terminating]
    endpoints = sorted(e for p in live if 0 <= p.ordinal < replicas and (e := p.endpoint))
    current = conditions(pods, replicas, hashes, problems, generation)
    result = {
        "replicas": len(live),
        "readyReplicas": sum(1 for p in live if p.ready),
        "selector": selector,
        "serviceName": name,
        "endpoints": endpoints,
        "conditions": merge_conditions((previous or {}).get("conditions"), current, timestamp or now()),
    }
    if generation is not None:
        result["observedGeneration"] = generation
    return result
