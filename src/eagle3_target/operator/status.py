"""The status block of an Eagle3Target from its observed pods: conditions whose lastTransitionTime moves
only when their status flips."""

from __future__ import annotations

import collections
import datetime
import re
from dataclasses import dataclass, field

from .planner import FAILING_REASONS, PodState, Rollout, parse_time


def format_time(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    drains_blocked: str = ""  # why the PodDisruptionBudget lets no eviction through, if it does not
    given_back: str = ""  # groups that gave their pods back for want of nodes, and why
    weights_version: str = ""  # spec.weights.version, if set
    refresh_errors: str = ""  # replicas that refused to refresh to it, and what they answered


def waiting_detail(pod: PodState) -> str:
    """The words of the scheduler or kubelet that say what a pod waits on, without the scheduler's preamble
    and its preemption report: "20 Insufficient nvidia.com/gpu", 'secret "token" not found'."""
    message = (pod.failing_message or pod.failing_reason or "").split(". preemption:")[0]
    message = re.sub(r"^\d+/\d+ nodes are available: ", "", message).rstrip(".")
    return message[:160]


def waiting(pods: list[PodState], rollout: Rollout) -> str:
    """For `kubectl get`: each distinct wait, most pods first ("3 pods: 20 Insufficient nvidia.com/gpu")."""
    blocked = [p for p in pods if not p.terminating and not p.ready and p.failing_reason]
    counts = collections.Counter(waiting_detail(p) for p in blocked if 0 <= p.ordinal < rollout.replicas)
    return "; ".join(f"{n} pod{'s' if n > 1 else ''}: {detail}" for detail, n in counts.most_common())


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
    elif observed.given_back:
        ready_cond = condition("Ready", False, "GroupUnschedulable", observed.given_back, generation)
    elif len(ready) >= rollout.replicas and not outdated and len(wanted) == rollout.replicas:
        ready_cond = condition("Ready", True, "AllTargetsReady", counts, generation)
    elif blocked := [p for p in wanted if not p.ready and p.failing_reason]:
        # what blocks the fleet, where `kubectl get` shows it (Reason column), with the pod's own words
        detail = f"{counts}; {blocked[0].name}: {waiting_detail(blocked[0])}"
        ready_cond = condition("Ready", False, blocked[0].failing_reason, detail, generation)
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

    progressing = _refreshing(progressing, wanted, observed)
    if observed.create_errors:
        message = "; ".join(observed.create_errors)
        degraded = condition("Degraded", True, "FailedCreate", message, generation)
    elif observed.given_back:
        degraded = condition("Degraded", True, "GroupUnschedulable", observed.given_back, generation)
    elif failing:
        names = ", ".join(f"{p.name}: {p.failing_reason}" for p in failing)
        degraded = condition("Degraded", True, "PodsFailing", names, generation)
    elif observed.refresh_errors:
        degraded = condition("Degraded", True, "RefreshFailed", observed.refresh_errors[:1024], generation)
    else:
        degraded = condition("Degraded", False, "AsExpected", "no failing targets", generation)
    return [ready_cond, progressing, degraded]


def _refreshing(progressing: dict, wanted: list[PodState], observed: Observed) -> dict:
    """A rolled-out fleet whose replicas do not all serve spec.weights yet is still progressing."""
    version, replicas = observed.weights_version, observed.rollout.replicas
    at_version = sum(p.target_version == version for p in wanted if p.rank == 0)
    if not version or at_version >= replicas or progressing["status"] == "True":
        return progressing
    message = f"{at_version}/{replicas} replicas serve weights {version}"
    return condition("Progressing", True, "RefreshingWeights", message, observed.generation)


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
    keys = ("observedGeneration", "replicas", "readyReplicas", "updatedReplicas", "targetVersionReplicas")
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
    result["waiting"] = observed.given_back[:200] or waiting(pods, rollout)
    if observed.generation is not None:
        result["observedGeneration"] = observed.generation
    if observed.weights_version:  # what `kubectl get` shows: the version, and how many replicas serve it
        result["targetVersion"] = observed.weights_version
        result["targetVersionReplicas"] = sum(
            p.target_version == observed.weights_version and 0 <= p.ordinal < rollout.replicas and p.rank == 0
            for p in live
        )
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
    current += _summary_conditions(current[0], stall, observed)
    result["conditions"] = merge_conditions(previous.get("conditions"), current, format_time(at))
    return result


def _summary_conditions(ready_cond: dict, stall: tuple[str, str] | None, observed: Observed) -> list[dict]:
    """Reconciling and Stalled (kstatus), and whether the budget blocks drains."""
    ready = ready_cond["status"] == "True"
    return [
        condition(
            "Reconciling",
            not ready and not stall,
            ready_cond["reason"],
            ready_cond["message"],
            observed.generation,
        ),
        condition(
            "Stalled",
            stall is not None,
            stall[0] if stall else "AsExpected",
            stall[1] if stall else ready_cond["message"],
            observed.generation,
        ),
        condition(
            "DrainsBlocked",
            bool(observed.drains_blocked),
            "NoEvictionAllowed" if observed.drains_blocked else "AsExpected",
            observed.drains_blocked or "drains may evict this target's pods",
            observed.generation,
        ),
    ]
