"""Dead nodes: a pod bound to a node that stopped reporting is lost once the pod's own toleration for that
has run out. The node lifecycle controller would evict it then, but a dead kubelet never confirms the
deletion, so the pod would hold its ordinal (and its name) until someone force-deletes it. Never while the
node says Ready: a slow shutdown is not a dead node."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .placement import NODE_FAILURE_TAINTS
from .planner import PodState, parse_time

NOT_READY, UNREACHABLE = NODE_FAILURE_TAINTS


@dataclass(frozen=True)
class NodeHealth:
    """What the operator's index keeps of a node: whether it is Ready, and since when each NoExecute
    failure taint has been on it (the node controller adds not-ready for False, unreachable for Unknown)."""

    ready: bool
    failing_since: tuple[tuple[str, float], ...] = ()  # (taint key, since)

    @classmethod
    def from_node(cls, body: dict[str, Any]) -> NodeHealth:
        status = body.get("status") or {}
        condition = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
        if condition.get("status") == "True":
            return cls(ready=True)
        since = []
        for taint in (body.get("spec") or {}).get("taints") or []:
            added = parse_time(taint.get("timeAdded"))
            if taint.get("key") in NODE_FAILURE_TAINTS and taint.get("effect") == "NoExecute" and added:
                since.append((taint["key"], added))
        if not since and condition.get("lastTransitionTime"):  # before the controller taints the node
            key = NOT_READY if condition.get("status") == "False" else UNREACHABLE
            since.append((key, parse_time(condition["lastTransitionTime"])))
        return cls(ready=False, failing_since=tuple(since))

    def outlived(self, pod: PodState, now: float) -> bool:
        """Whether `pod`'s toleration for this node's failure has run out."""
        if self.ready:
            return False
        for key, since in self.failing_since:
            seconds = dict(pod.node_tolerations).get(key, 0.0)
            if seconds is not None and since + seconds <= now:
                return True
        return False


def lost_pods(pods: list[PodState], nodes: dict[str, NodeHealth], now: float) -> frozenset[str]:
    """Names of the pods whose node is dead past the pod's toleration."""
    return frozenset(p.name for p in pods if p.node and p.node in nodes and nodes[p.node].outlived(p, now))
