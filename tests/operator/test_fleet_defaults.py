"""What a target gets by default on a many-node cluster, as pure builders and decisions: its
PodDisruptionBudget, a soft spread, the GPU and node-failure tolerations, the revision label, the
tensor-parallel size, the wait reason in status, and replacing pods on dead nodes."""

from __future__ import annotations

import pytest
from pod_state_support import pod_state as shared_pod_state

from eagle3_target.operator import builders, discovery
from eagle3_target.operator.disruption import Disruption, switch_bound
from eagle3_target.operator.nodes import NodeHealth, lost_pods
from eagle3_target.operator.placement import REVISION_LABEL
from eagle3_target.operator.planner import PodState, Rollout, plan
from eagle3_target.operator.status import Observed, compute_status
from eagle3_target.operator.target_spec import TargetSpec

IMAGE = "registry.test/eagle3-target:test"
SCHEDULER = (
    "0/20 nodes are available: 20 Insufficient nvidia.com/gpu. preemption: 0/20 nodes are available: "
    "20 No preemption victims found for incoming pod."
)


def target(**spec) -> TargetSpec:
    return TargetSpec.parse({"model": "org/model", **spec})


def budget(spec: TargetSpec) -> dict | None:
    found = [c for c in discovery.children(spec, "llama", "ml") if c["kind"] == "PodDisruptionBudget"]
    return found[0] if found else None


def test_every_target_gets_a_budget_of_one_unavailable_that_never_holds_unhealthy_pods():
    pdb = budget(target(replicas=8))
    assert pdb["metadata"]["name"] == "llama"
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": builders.selector("llama")},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }
    assert budget(target(disruption={"minAvailable": 6}))["spec"]["minAvailable"] == 6
    assert budget(target(disruption={"enabled": False})) is None
    # switching bounds removes the other one in the same merge patch
    assert switch_bound(budget(target(disruption={"minAvailable": 6})))["spec"]["maxUnavailable"] is None


@pytest.mark.parametrize(
    ("disruption", "replicas", "blocked"),
    [
        ({}, 1, False),
        ({"maxUnavailable": 0}, 1, True),
        ({"maxUnavailable": 0}, 4, True),
        ({"minAvailable": 4}, 4, True),
        ({"minAvailable": 3}, 4, False),
        ({"maxUnavailable": 0, "enabled": False}, 4, False),
        ({"maxUnavailable": 0}, 0, False),
    ],
)
def test_a_budget_that_allows_no_eviction_is_said_so(disruption, replicas, blocked):
    assert Disruption.parse(disruption).blocks_drains(replicas) is blocked


def test_drains_blocked_condition():
    observed = Observed(Rollout(1, "r"), drains_blocked="allows no eviction", generation=1)
    status = compute_status(name="t", pods=[], observed=observed, selector="s", previous=None, at=0.0)
    cond = next(c for c in status["conditions"] if c["type"] == "DrainsBlocked")
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "True",
        "NoEvictionAllowed",
        "allows no eviction",
    )
    quiet = compute_status(
        name="t", pods=[], observed=Observed(Rollout(1, "r")), selector="s", previous=None, at=0.0
    )
    assert next(c for c in quiet["conditions"] if c["type"] == "DrainsBlocked")["status"] == "False"


def test_pods_spread_softly_by_zone_and_host_per_revision_and_carry_the_revision_label():
    spec = target()
    pod = builders.pod(spec, "llama", "ml", 0, IMAGE)
    assert pod["metadata"]["labels"][REVISION_LABEL] == builders.revision(spec)
    spread = pod["spec"]["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in spread] == ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
    for constraint in spread:
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"
        assert constraint["matchLabelKeys"] == [REVISION_LABEL]
        assert constraint["labelSelector"] == {"matchLabels": builders.selector("llama")}


def test_the_users_spread_replaces_the_default_and_an_empty_list_turns_it_off():
    own = [{"maxSkew": 2, "topologyKey": "rack", "whenUnsatisfiable": "DoNotSchedule"}]
    pod = builders.pod(target(podTemplate={"spec": {"topologySpreadConstraints": own}}), "l", "ml", 0, IMAGE)
    assert pod["spec"]["topologySpreadConstraints"] == own
    off = builders.pod(target(podTemplate={"spec": {"topologySpreadConstraints": []}}), "l", "ml", 0, IMAGE)
    assert off["spec"]["topologySpreadConstraints"] == []


def tolerations(**spec) -> dict[str, dict]:
    pod = builders.pod(target(**spec), "llama", "ml", 0, IMAGE)
    return {t["key"]: t for t in pod["spec"]["tolerations"]}


def test_gpu_taint_and_node_failure_tolerations_by_default():
    found = tolerations(gpusPerReplica=2)
    assert found["nvidia.com/gpu"] == {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        assert found[key] == {
            "key": key,
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 60,
        }
    assert "amd.com/gpu" in tolerations(gpuResourceName="amd.com/gpu")
    assert "nvidia.com/gpu" not in tolerations(gpusPerReplica=0)
    assert "nvidia.com/gpu" not in tolerations(tolerateGpuTaint=False)
    assert (
        tolerations(nodeFailureToleranceSeconds=10)["node.kubernetes.io/unreachable"]["tolerationSeconds"]
        == 10
    )


def test_the_users_own_toleration_for_a_key_wins():
    own = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}
    found = tolerations(podTemplate={"spec": {"tolerations": [own]}})
    assert found["node.kubernetes.io/unreachable"] == own
    assert found["node.kubernetes.io/not-ready"]["tolerationSeconds"] == 60


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"engine": "vllm", "gpusPerReplica": 4}, ["--tensor-parallel-size", "4"]),
        ({"engine": "hf", "gpusPerReplica": 2}, ["--tensor-parallel-size", "2"]),
        ({"engine": "sglang", "gpusPerReplica": 8}, ["--tensor-parallel-size", "8"]),
        ({"engine": "vllm", "gpusPerReplica": 1}, []),
        ({"engine": "vllm", "gpusPerReplica": 4, "args": ["--tensor-parallel-size=2"]}, []),
    ],
)
def test_gpus_per_replica_becomes_the_tensor_parallel_size_unless_args_set_it(spec, expected):
    args = builders.server_args(target(**spec), 0)
    start = next((i for i, a in enumerate(args) if a == "--tensor-parallel-size"), None)
    assert (args[start : start + 2] if start is not None else []) == expected


def test_an_engine_that_cannot_split_a_replica_is_not_ready_with_the_reason():
    problems = target(engine="sglang", gpusPerReplica=4, nodesPerReplica=2).problems()
    observed = Observed(Rollout(1, ""), problems=problems, generation=1)
    status = compute_status(name="t", pods=[], observed=observed, selector="s", previous=None, at=0.0)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and "engine sglang cannot span 2 nodes" in ready["message"]


def pod_state(ordinal: int, **kw) -> PodState:
    return shared_pod_state(ordinal, spec_hash="r", **kw)


def test_the_wait_reason_is_the_ready_reason_and_a_short_column():
    pending = dict(ready=False, phase="Pending", failing_reason="Unschedulable", failing_message=SCHEDULER)
    pods = [pod_state(0), pod_state(1, **pending), pod_state(2, **pending)]
    status = compute_status(
        name="t", pods=pods, observed=Observed(Rollout(3, "r")), selector="s", previous=None, at=0.0
    )
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "Unschedulable" and "20 Insufficient nvidia.com/gpu" in ready["message"]
    assert status["waiting"] == "2 pods: 20 Insufficient nvidia.com/gpu"
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["message"] != "no failing targets"
    config = dict(ready=False, phase="Pending", failing_reason="CreateContainerConfigError")
    secret = pod_state(0, **config, failing_message='secret "qwen3-target-token" not found')
    status = compute_status(
        name="t", pods=[secret], observed=Observed(Rollout(1, "r")), selector="s", previous=None, at=0.0
    )
    assert status["waiting"] == '1 pod: secret "qwen3-target-token" not found'
    assert (
        next(c for c in status["conditions"] if c["type"] == "Ready")["reason"]
        == "CreateContainerConfigError"
    )


def node(ready: str, taint: str | None = None, at: str = "2026-01-01T00:00:00Z") -> NodeHealth:
    taints = [{"key": taint, "effect": "NoExecute", "timeAdded": at}] if taint else []
    conditions = [{"type": "Ready", "status": ready, "lastTransitionTime": at}]
    return NodeHealth.from_node({"spec": {"taints": taints}, "status": {"conditions": conditions}})


EPOCH = 1767225600.0  # 2026-01-01T00:00:00Z
TOLERATES_10 = (("node.kubernetes.io/not-ready", 10), ("node.kubernetes.io/unreachable", 10))


def test_a_pod_is_lost_only_past_its_toleration_on_a_node_that_is_not_ready():
    pod = pod_state(0, node="n1", node_tolerations=TOLERATES_10)
    dead = {"n1": node("Unknown", "node.kubernetes.io/unreachable")}
    assert lost_pods([pod], dead, EPOCH + 9) == frozenset()
    assert lost_pods([pod], dead, EPOCH + 10) == {"t-0"}
    # Ready wins over a stale taint: a slow shutdown is not a dead node
    assert (
        lost_pods([pod], {"n1": node("True", "node.kubernetes.io/unreachable")}, EPOCH + 999) == frozenset()
    )
    # before the controller taints the node, the Ready condition's transition counts
    assert lost_pods([pod], {"n1": node("False")}, EPOCH + 10) == {"t-0"}
    forever = pod_state(0, node="n1", node_tolerations=(("node.kubernetes.io/unreachable", None),))
    assert lost_pods([forever], dead, EPOCH + 1e6) == frozenset()
    assert lost_pods([pod], {}, EPOCH + 1e6) == frozenset(), "an unknown node is not a dead one"


def test_a_lost_pod_is_replaced_at_once_under_a_new_name():
    pods = [pod_state(0, node="n1"), pod_state(1, node="n2", terminating=True, deadline=EPOCH)]
    step = plan("t", pods, Rollout(2, "r"), now=EPOCH + 1, grace=300, lost=frozenset({"t-1"}))
    assert step.create == [(1, "t-1-r1")] and step.delete == []
    # without the node's word the stuck-pod grace still waits
    assert plan("t", pods, Rollout(2, "r"), now=EPOCH + 1, grace=300).create == []


def test_a_pod_creating_its_containers_is_told_apart_and_its_mount_failure_named():
    from eagle3_target.operator.tracked import MOUNT_GRACE, Tracked

    body = {
        "metadata": {"name": "t-0", "labels": {"eagle3.dev/ordinal": "0"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "server"}]},
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ],
            "containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}],
        },
    }
    pod = PodState.from_pod(body)
    assert pod.creating_since == EPOCH and pod.failing_reason is None and pod.node == "n1"
    tracked = Tracked(body={})
    tracked.mounts = {"t-0": 'MountVolume.SetUp failed for volume "auth-token" : secret "tok" not found'}
    (named,) = tracked.with_mounts([pod])
    assert (named.failing_reason, named.failing_message) == ("FailedMount", 'secret "tok" not found')
    assert MOUNT_GRACE <= 30
