"""Scheduling defaults for a fleet on many nodes: a soft spread over zones and hosts, a toleration for the GPU
taint that managed GPU pools carry, and a bounded wait on a dead node. Each one yields to the user's own."""

from __future__ import annotations

from . import GROUP

REVISION_LABEL = f"{GROUP}/revision"
ZONE_KEY = "topology.kubernetes.io/zone"
HOST_KEY = "kubernetes.io/hostname"
# the NoExecute taints the node lifecycle controller puts on a node whose kubelet stopped reporting
NODE_FAILURE_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def spread(selector: dict[str, str]) -> list[dict]:
    """Best effort (`ScheduleAnyway`): on a skewed cluster the pods still start, preferring empty zones and
    hosts. `matchLabelKeys` counts only pods of the same revision, so a surge rollout's new pods spread among
    themselves instead of around the old ones."""
    return [
        {
            "maxSkew": 1,
            "topologyKey": key,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": dict(selector)},
            "matchLabelKeys": [REVISION_LABEL],
        }
        for key in (ZONE_KEY, HOST_KEY)
    ]


def tolerations(user: list[dict], gpu_resource: str | None, node_failure_seconds: int) -> list[dict]:
    """The user's tolerations, then ours for what they leave out: the GPU resource's NoSchedule taint (when
    the pod asks for GPUs) and how long to stay bound to a node that stopped reporting."""
    result = [dict(t) for t in user]
    keys = {t.get("key") for t in user}
    if gpu_resource and gpu_resource not in keys:
        result.append({"key": gpu_resource, "operator": "Exists", "effect": "NoSchedule"})
    for key in NODE_FAILURE_TAINTS:
        if key not in keys:
            result.append(
                {
                    "key": key,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": node_failure_seconds,
                }
            )
    return result
