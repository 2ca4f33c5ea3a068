"""Replicas that span nodes (`spec.nodesPerReplica: K > 1`): each replica is a group of one leader pod (node
rank 0, the only one that serves the model) and K-1 worker pods, on K distinct nodes. What a group's pods
carry besides a one-pod replica's: labels naming the group and rank, the server's multi-node arguments, a
required anti-affinity within the group, and a PodDisruptionBudget written in pods that lets one eviction
break at most one group."""

from __future__ import annotations

from . import GROUP
from .placement import HOST_KEY
from .target_spec import TargetSpec

GROUP_LABEL = f"{GROUP}/group"  # the leader pod's name: one value per group, new for each incarnation
RANK_LABEL = f"{GROUP}/rank"
ROLE_LABEL = f"{GROUP}/role"
LEADER, WORKER = "leader", "worker"
# Engines whose replica splits into pipeline stages, one per node; hf's tensor-parallel group spans the nodes.
PIPELINE_PARALLEL_ENGINES = ("vllm",)


def spans_nodes(spec: TargetSpec) -> bool:
    return spec.nodes_per_replica > 1


def member_name(group: str, rank: int) -> str:
    """Rank 0 is the group itself (`<target>-<ordinal>`, the leader); workers are `<group>-w<rank>`."""
    return group if rank == 0 else f"{group}-w{rank}"


def member_hostname(leader_hostname: str, rank: int) -> str:
    return leader_hostname if rank == 0 else f"{leader_hostname}-w{rank}"


def member_labels(group: str, rank: int) -> dict[str, str]:
    return {GROUP_LABEL: group, RANK_LABEL: str(rank), ROLE_LABEL: LEADER if rank == 0 else WORKER}


def leader_address(leader_hostname: str, subdomain: str, namespace: str, cluster_domain: str) -> str:
    """The leader's stable DNS name under the peers Service (published before readiness): it outlives pod
    IPs, and a recreated group's leader gets the same name."""
    return f"{leader_hostname}.{subdomain}.{namespace}.svc.{cluster_domain}"


def tensor_parallel_size(spec: TargetSpec) -> int:
    """vLLM's usual split: tensor parallel within a node; an engine without pipeline parallel spans the nodes
    with its tensor-parallel group instead (one rank per GPU, or per node on CPU)."""
    if spans_nodes(spec) and spec.engine not in PIPELINE_PARALLEL_ENGINES:
        return max(spec.gpus_per_replica, 1) * spec.nodes_per_replica
    return spec.gpus_per_replica


def _given(args: tuple[str, ...], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def server_args(spec: TargetSpec, rank: int, master_addr: str, master_port: int) -> list[str]:
    """The multi-node arguments; pipeline parallel across the nodes (vllm) unless `args` set a split."""
    result = [
        "--nnodes",
        str(spec.nodes_per_replica),
        "--node-rank",
        str(rank),
        "--master-addr",
        master_addr,
        "--master-port",
        str(master_port),
    ]
    if spec.engine in PIPELINE_PARALLEL_ENGINES and not _given(spec.args, "--pipeline-parallel-size"):
        result += ["--pipeline-parallel-size", str(spec.nodes_per_replica)]
    return result


def with_anti_affinity(pod_spec: dict, group: str) -> dict:
    """A required anti-affinity on hostname among the group's own pods, added to whatever affinity the user
    set: two ranks of one group never share a node (other groups may)."""
    term = {"labelSelector": {"matchLabels": {GROUP_LABEL: group}}, "topologyKey": HOST_KEY}
    affinity = pod_spec.setdefault("affinity", {})
    anti = affinity.setdefault("podAntiAffinity", {})
    anti.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(term)
    return pod_spec


def in_pods(spec: TargetSpec, budget_: dict) -> dict:
    """A target's PodDisruptionBudget with its bound rewritten for groups (unchanged for one-pod replicas)."""
    if not spans_nodes(spec):
        return budget_
    kept = {k: v for k, v in budget_["spec"].items() if k not in ("maxUnavailable", "minAvailable")}
    return {**budget_, "spec": {**budget(spec), **kept}}


def budget(spec: TargetSpec) -> dict[str, int]:
    """The budget over all the target's pods, in pods: each eviction breaks at most one group, so allowing
    `replicas - <groups kept whole>` evictions bounds the groups a drain takes at once; once a group breaks,
    its K pods are unhealthy and hold further evictions until it is whole again. (A budget over leaders
    only would leave workers unprotected, and maxUnavailable in pods is counted against the /scale replicas,
    which are groups.)"""
    pods = spec.replicas * spec.nodes_per_replica
    bound = spec.disruption.budget()
    if "minAvailable" in bound:
        breakable = max(spec.replicas - bound["minAvailable"], 0)
    else:
        breakable = min(bound["maxUnavailable"], spec.replicas)
    return {"minAvailable": max(pods - breakable, 0)}
