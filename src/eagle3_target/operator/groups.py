"""Replicas that span nodes (`spec.nodesPerReplica: K > 1`): each replica is a group of one leader pod (node
rank 0, the only one that serves the model) and K-1 worker pods, on K distinct nodes. What a group's pods
carry besides a one-pod replica's: labels naming the group and rank, the server's multi-node arguments, a
required anti-affinity within the group, and a PodDisruptionBudget written in pods that lets one eviction
break at most one group."""

from __future__ import annotations

from eagle3_target.protocol.engines import engines

from . import GROUP
from .placement import HOST_KEY
from .target_spec import TargetSpec

GROUP_LABEL = f"{GROUP}/group"  # the leader pod's name: one value per group, new for each incarnation
RANK_LABEL = f"{GROUP}/rank"
ROLE_LABEL = f"{GROUP}/role"
LEADER, WORKER = "leader", "worker"
TENSOR_FLAG, PIPELINE_FLAG = "--tensor-parallel-size", "--pipeline-parallel-size"


def spans_nodes(spec: TargetSpec) -> bool:
    return spec.nodes_per_replica > 1


def both_at_once(spec: TargetSpec) -> bool:
    """Whether the engine combines tensor parallel within a node with pipeline parallel across nodes (vllm);
    hf splits a replica one way at a time (the engine table says which)."""
    known = engines().get(spec.engine)  # an unknown engine is the spec's problems() to report
    return known is not None and known.both_at_once


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


def default_split(spec: TargetSpec) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes of a replica. vLLM's usual split: tensor parallel within a node,
    pipeline parallel across nodes. hf, one way at a time: pipeline stages across the nodes of one-GPU (or
    CPU) pods, which pass one hidden state per boundary; otherwise one tensor-parallel group over every GPU."""
    gpus, nodes = spec.gpus_per_replica, spec.nodes_per_replica
    if nodes == 1 or both_at_once(spec):
        return gpus, nodes
    return (1, nodes) if gpus <= 1 else (gpus * nodes, 1)


def split_args(spec: TargetSpec, flag: str) -> list[str]:
    """`flag` with its default size, unless `args` set it (or, for an engine that splits one way at a time,
    set the other split) or the size is 1."""
    given = [f for f in (TENSOR_FLAG, PIPELINE_FLAG) if _given(spec.args, f)]
    size = default_split(spec)[0 if flag == TENSOR_FLAG else 1]
    if size <= 1 or flag in given or (given and not both_at_once(spec)):
        return []
    return [flag, str(size)]


def _given(args: tuple[str, ...], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def server_args(spec: TargetSpec, rank: int, master_addr: str, master_port: int) -> list[str]:
    """The multi-node arguments, and pipeline parallel across the nodes where that is the default split."""
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
    return result + split_args(spec, PIPELINE_FLAG)


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
