"""Pure decisions over observed pods: which pod to create or delete next (scaling, healing, abandoning pods
stuck on dead nodes, Deployment-like rollouts) and the status block, whose conditions' lastTransitionTime
moves only when their status flips."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from .builders import HASH_ANNOTATION, ORDINAL_LABEL, pod_name

# Waiting reasons that will not fix themselves while the spec stays as it is: Stalled, Degraded.
FAILING_REASONS = {
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "InvalidImageName",
    "Unschedulable",
}


def parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def format_time(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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

    @classmethod
    def from_pod(cls, body: dict[str, Any]) -> PodState:
        meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status") or {}
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
        if phase == "Failed":
            failing = {"reason": status.get("reason") or "PodFailed", "message": status.get("message", "")}
        return cls(
            name=meta["name"],
            ordinal=int(meta.get("labels", {}).get(ORDINAL_LABEL, -1)),
            spec_hash=meta.get("annotations", {}).get(HASH_ANNOTATION, ""),
            ready=conditions.get("Ready", {}).get("status") == "True" and bool(status.get("podIP")),
            ip=status.get("podIP"),
            http_port=ports[0]["containerPort"] if ports else None,
            phase=phase,
            terminating=bool(meta.get("deletionTimestamp")),
            failing_reason=failing.get("reason"),
            failing_message=failing.get("message") or "",
            deadline=parse_time(meta.get("deletionTimestamp")),
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


def plan(target: str, pods: list[PodState], rollout: Rollout, now: float = 0.0, grace: float = 300.0) -> Plan:
    """Deployment semantics over ordinals: never more than replicas + maxSurge pods (a pod still terminating
    holds its GPU, so it counts until abandoned) and never fewer than replicas - maxUnavailable ready ones."""
    result = Plan()
    taken = {p.name for p in pods}
    live = [p for p in pods if not p.terminating]
    leaving = [p for p in pods if p.terminating and not p.abandoned(now, grace)]
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


def now() -> str:
    return format_time(datetime.datetime.now(datetime.UTC).timestamp())


def condition(type_: str, status: bool, reason: str, message: str, generation: int | None) -> dict:
    result = {"type": type_, "status": "True" if status else "False", "reason": reason, "message": message}
    if generation is not None:
        result["observedGeneration"] = generation
    return result


def merge_conditions(previous: list[dict] | None, current: list[dict], timestamp: str) -> list[dict]:
    """Carry each condition's lastTransitionTime over unless its status flipped. Only the operator's own
    conditions count (they carry observedGeneration): the CRD's placeholder default has none."""
    old = {c.get("type"): c for c in previous or [] if "observedGeneration" in c}
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


@dataclass(frozen=True)
class Observed:
    """Everything the status depends on besides the pods."""

    rollout: Rollout
    problems: list[str] = field(default_factory=list)  # an invalid spec
    create_errors: list[str] = field(default_factory=list)  # "pod: API message" per refused creation
    progress_deadline: float = 1800.0
    generation: int | None = None


def _fleet_conditions(pods: list[PodState], observed: Observed) -> list[dict]:
    rollout, generation = observed.rollout, observed.generation
    live = [p for p in pods if not p.terminating]
    wanted = [p for p in live if 0 <= p.ordinal < rollout.replicas]
    ready = [p for p in wanted if p.ready]
    outdated = [p for p in wanted if rollout.wants_update(p)]
    failing = [p for p in live if p.failing_reason]
    counts = f"{len(ready)}/{rollout.replicas} targets ready"

    if rollout.replicas == 0:
        ready_cond = condition("Ready", True, "ScaledToZero", "no targets requested", generation)
    elif observed.create_errors:
        ready_cond = condition("Ready", False, "FailedCreate", "; ".join(observed.create_errors), generation)
    elif len(ready) >= rollout.replicas and not outdated and len(wanted) == rollout.replicas:
        ready_cond = condition("Ready", True, "AllTargetsReady", counts, generation)
    elif len(wanted) < rollout.replicas or any(p.phase == "Pending" for p in wanted):
        ready_cond = condition("Ready", False, "PodsStarting", counts, generation)
    elif outdated:
        ready_cond = condition("Ready", False, "RollingUpdate", counts, generation)
    else:
        ready_cond = condition("Ready", False, "ModelLoading", counts, generation)

    if outdated:
        progressing = condition(
            "Progressing", True, "RollingUpdate", f"{len(outdated)} pods to replace", generation
        )
    elif len(live) != rollout.replicas:
        progressing = condition(
            "Progressing", True, "Scaling", f"{len(live)} pods, {rollout.replicas} wanted", generation
        )
    elif len(ready) < rollout.replicas:
        progressing = condition("Progressing", True, "ModelLoading", counts, generation)
    else:
        progressing = condition("Progressing", False, "RolloutComplete", counts, generation)

    if observed.create_errors:
        message = "; ".join(observed.create_errors)
        degraded = condition("Degraded", True, "FailedCreate", message, generation)
    elif failing:
        names = ", ".join(f"{p.name}: {p.failing_reason}" for p in failing)
        degraded = condition("Degraded", True, "PodsFailing", names, generation)
    else:
        degraded = condition("Degraded", False, "AsExpected", "no failing targets", generation)
    return [ready_cond, progressing, degraded]


def _stall(pods: list[PodState], observed: Observed, conditions: list[dict]) -> tuple[str, str] | None:
    """Why the fleet will not get Ready without someone's help: an invalid spec, a pod that cannot be
    scheduled, pulled or kept running, or no progress within the deadline."""
    if observed.problems:
        return "InvalidSpec", "; ".join(observed.problems)
    failing = next((p for p in pods if not p.terminating and p.failing_reason in FAILING_REASONS), None)
    if failing is not None:
        return failing.failing_reason, f"{failing.name}: {failing.failing_message or failing.failing_reason}"
    progressing = next(c for c in conditions if c["type"] == "Progressing")
    if progressing.get("reason") == "ProgressDeadlineExceeded":
        return "ProgressDeadlineExceeded", progressing["message"]
    return None


def _invalid_conditions(message: str, generation: int | None) -> list[dict]:
    return [
        condition("Ready", False, "InvalidSpec", message, generation),
        condition("Progressing", False, "InvalidSpec", message, generation),
        condition("Degraded", True, "InvalidSpec", message, generation),
    ]


def _track_progress(conditions: list[dict], previous: dict, current: dict, observed: Observed, at: float):
    """Deployment's progress deadline: Progressing carries lastUpdateTime, which moves whenever the fleet
    gets closer to its goal; past the deadline without that, Progressing turns False."""
    progressing = next(c for c in conditions if c["type"] == "Progressing")
    before = next((c for c in previous.get("conditions") or [] if c.get("type") == "Progressing"), {})
    keys = ("observedGeneration", "replicas", "readyReplicas", "updatedReplicas")
    moved = any(previous.get(k) != current.get(k) for k in keys) or not before.get("lastUpdateTime")
    updated = format_time(at) if moved else before["lastUpdateTime"]
    progressing["lastUpdateTime"] = updated
    if progressing["status"] == "True" and at - parse_time(updated) > observed.progress_deadline:
        progressing.update(
            status="False",
            reason="ProgressDeadlineExceeded",
            message=f"no progress for {observed.progress_deadline:g} s: {progressing['message']}",
        )


def compute_status(
    *,
    name: str,
    pods: list[PodState],
    observed: Observed,
    selector: str,
    previous: dict | None,
    image: str = "",
    at: float | None = None,
) -> dict:
    """The whole status block; equal input gives an equal block (so an unchanged status is not re-patched)."""
    previous = previous or {}
    at = datetime.datetime.now(datetime.UTC).timestamp() if at is None else at
    rollout = observed.rollout
    live = [p for p in pods if not p.terminating]
    endpoints = sorted(e for p in live if 0 <= p.ordinal < rollout.replicas and (e := p.endpoint))
    result = {
        "replicas": len(live),
        "readyReplicas": sum(1 for p in live if p.ready),
        "updatedReplicas": sum(1 for p in live if p.spec_hash == rollout.revision),
        "selector": selector,
        "serviceName": name,
        "endpoints": endpoints,
    }
    if observed.generation is not None:
        result["observedGeneration"] = observed.generation
    if rollout.revision:
        result["revision"] = rollout.revision
    if image:
        result["image"] = image
    if observed.problems:
        current = _invalid_conditions("; ".join(observed.problems), observed.generation)
    else:
        current = _fleet_conditions(pods, observed)
        _track_progress(current, previous, result, observed, at)
    stall = _stall(pods, observed, current)
    ready = current[0]["status"] == "True"
    current += [
        condition(
            "Reconciling",
            not ready and not stall,
            current[0]["reason"],
            current[0]["message"],
            observed.generation,
        ),
        condition(
            "Stalled",
            stall is not None,
            stall[0] if stall else "AsExpected",
            stall[1] if stall else current[0]["message"],
            observed.generation,
        ),
    ]
    result["conditions"] = merge_conditions(previous.get("conditions"), current, format_time(at))
    return result
