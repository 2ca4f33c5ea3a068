"""Planning for replicas that span nodes: a group lives and dies whole. Each group is folded into one
PodState, so that the replica planner (scaling, healing, rollouts with maxSurge, maxUnavailable and
partition) and the status count groups; its decisions are then spread back over the group's pods. A group
missing a pod, or holding a failed one, is deleted whole and recreated; a group whose pods are not all
scheduled within the timeout gives its pods back and waits before it is tried again."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .builders import TERMINATION_GRACE_SECONDS
from .planner import Plan, PodState, Rollout, plan
from .status import waiting_detail

MIN_RETRY_SECONDS = 30.0


@dataclass
class GroupPlan:
    """`plan.create` names groups (each becomes K pods); `plan.delete` names pods. `states`: one per group,
    for the status. `given_back`: ordinal -> (retry after, why) for groups released this pass."""

    plan: Plan
    states: list[PodState]
    given_back: dict[int, tuple[float, str]] = field(default_factory=dict)


def by_group(pods: list[PodState]) -> dict[str, list[PodState]]:
    found: dict[str, list[PodState]] = {}
    for p in sorted(pods, key=lambda p: (p.rank, p.name)):
        found.setdefault(p.group_name, []).append(p)
    return found


def broken(members: list[PodState], k: int, lost: frozenset[str]) -> str:
    """Why the group must be recreated whole ("" while it is whole)."""
    if any(p.terminating or p.name in lost for p in members) or len(members) < k:
        return "a pod of the group is gone"
    failed = next((p for p in members if p.phase in ("Failed", "Succeeded")), None)
    return f"pod {failed.name} {failed.phase}" if failed else ""


def unplaced(members: list[PodState], now: float, timeout: float) -> str:
    """Why the group gives its pods back: some are still unscheduled `timeout` after the group was made."""
    waiting = [p for p in members if not p.bound and not p.terminating]
    started = min((p.created_at for p in members if p.created_at is not None), default=None)
    if not waiting or started is None or now - started < timeout:
        return ""
    detail = waiting_detail(waiting[0]) or "not scheduled"
    return f"{len(waiting)} of {len(members)} pods not scheduled within {timeout:g} s: {detail}"


def fold(name: str, members: list[PodState], leaving: bool, now: float) -> PodState:
    """One group as one replica: ready when every member is; terminating while any must go."""
    leader = next((p for p in members if p.rank == 0), None)
    first = leader or members[0]
    failing = next((p for p in members if p.failing_reason), None)
    deadlines = [p.deadline if p.terminating else now + TERMINATION_GRACE_SECONDS for p in members]
    return dataclasses.replace(
        first,
        name=name,
        ready=leader is not None and not leaving and all(p.ready for p in members),
        ip=leader.ip if leader else None,
        phase="Pending" if any(p.phase == "Pending" for p in members) else first.phase,
        terminating=leaving,
        failing_reason=failing.failing_reason if failing else None,
        failing_message=failing.failing_message if failing else "",
        deadline=max((d for d in deadlines if d is not None), default=None) if leaving else None,
    )


def plan_groups(
    target: str,
    pods: list[PodState],
    rollout: Rollout,
    k: int,
    *,
    now: float,
    grace: float,
    lost: frozenset[str] = frozenset(),
    timeout: float = 600.0,
    held: dict[int, float] | None = None,
) -> GroupPlan:
    """`held`: ordinal -> time before which a given-back group is not created again."""
    deletes: list[str] = []
    states, gone, given_back = [], set(), {}
    for name, members in by_group(pods).items():
        why_broken = broken(members, k, lost)
        why_unplaced = "" if why_broken else unplaced(members, now, timeout)
        leaving = bool(why_broken or why_unplaced)
        if leaving:
            deletes += [p.name for p in members if not p.terminating and p.name not in lost]
        if why_unplaced:
            retry = now + max(timeout, MIN_RETRY_SECONDS)
            given_back[members[0].ordinal] = (retry, f"group {name}: {why_unplaced}")
        if all(p.name in lost for p in members):
            gone.add(name)
        states.append(fold(name, members, leaving, now))
    step = plan(target, states, rollout, now, grace, frozenset(gone))
    waiting = {**(held or {}), **{o: t for o, (t, _) in given_back.items()}}
    step.create = [(o, n) for o, n in step.create if waiting.get(o, 0.0) <= now]
    members_of = by_group(pods)
    for name in step.delete:
        deletes += [p.name for p in members_of.get(name, []) if not p.terminating and p.name not in deletes]
    step.delete = list(dict.fromkeys(deletes))
    live_states = [s for s in states if s.name not in gone]
    return GroupPlan(step, live_states, given_back)


def counted_states(target, tracked, pods: list[PodState], now: float) -> list[PodState]:
    """What the status counts: pods, or with nodesPerReplica > 1 one folded state per group."""
    if target is None or not target.nodes_per_replica > 1:
        return pods
    name = tracked.body["metadata"]["name"]
    return plan_groups(name, pods, Rollout(0, ""), target.nodes_per_replica, now=now, grace=0.0).states
