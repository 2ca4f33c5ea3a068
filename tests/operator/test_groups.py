"""Replicas that span nodes (nodesPerReplica K > 1): a group's pods, endpoints, budget, whole-group decisions,
the schedule timeout, and group counting in the status."""

from __future__ import annotations

import dataclasses

import pytest

from eagle3_target.operator import builders, discovery, groups
from eagle3_target.operator.group_planner import plan_groups
from eagle3_target.operator.planner import PodState, Rollout
from eagle3_target.operator.status import Observed, compute_status
from eagle3_target.operator.target_spec import TargetSpec

IMAGE = "registry.test/eagle3-target:test"
LEADER_DNS = "llama-0.llama-peers.ml.svc.cluster.local"


def target(**spec) -> TargetSpec:
    return TargetSpec.parse(
        {"model": "org/model", "engine": "vllm", "gpusPerReplica": 8, "nodesPerReplica": 2, **spec}
    )


def member(ordinal: int, rank: int, *, group: str = "", **kw) -> PodState:
    group = group or f"llama-{ordinal}"
    fields = dict(
        name=groups.member_name(group, rank),
        ordinal=ordinal,
        spec_hash="rev",
        ready=True,
        ip=f"10.0.{ordinal}.{rank + 1}",
        http_port=8001,
        phase="Running",
        terminating=False,
        failing_reason=None,
        group=group,
        rank=rank,
        created_at=0.0,
        bound=True,
        node=f"node-{ordinal}-{rank}",
    )
    return PodState(**{**fields, **kw})


def whole(ordinal: int, k: int = 2, **kw) -> list[PodState]:
    return [member(ordinal, rank, **kw) for rank in range(k)]


def test_one_node_per_replica_changes_nothing():
    one = TargetSpec.parse({"model": "org/model"})
    assert one.nodes_per_replica == 1 and one.group_schedule_timeout_seconds == 600
    assert builders.revision(one) == builders.revision(
        TargetSpec.parse({"model": "org/model", "nodesPerReplica": 1})
    )
    pod = builders.pod(one, "llama", "ml", 0, IMAGE)
    assert not any(k.startswith(groups.GROUP_LABEL.split("/")[0] + "/g") for k in pod["metadata"]["labels"])
    assert "--nnodes" not in pod["spec"]["containers"][0]["args"]
    assert "affinity" not in pod["spec"]
    assert discovery.service(one, "llama", "ml")["spec"]["selector"] == builders.selector("llama")


def test_a_group_is_a_leader_and_workers_with_names_labels_and_multi_node_args():
    spec = target()
    leader = builders.pod(spec, "llama", "ml", 0, IMAGE, "llama-0", 0)
    worker = builders.pod(spec, "llama", "ml", 0, IMAGE, "llama-0", 1)
    assert (leader["metadata"]["name"], worker["metadata"]["name"]) == ("llama-0", "llama-0-w1")
    assert leader["metadata"]["labels"][groups.ROLE_LABEL] == "leader"
    assert (
        worker["metadata"]["labels"].items()
        >= {
            groups.GROUP_LABEL: "llama-0",
            groups.RANK_LABEL: "1",
            groups.ROLE_LABEL: "worker",
            builders.ORDINAL_LABEL: "0",
        }.items()
    )
    assert (leader["spec"]["hostname"], worker["spec"]["hostname"]) == ("llama-0", "llama-0-w1")
    assert worker["spec"]["subdomain"] == "llama-peers"
    args = worker["spec"]["containers"][0]["args"]
    tail = args[args.index("--nnodes") :]
    assert tail == [
        "--nnodes", "2", "--node-rank", "1", "--master-addr", LEADER_DNS, "--master-port", "29607",
        "--pipeline-parallel-size", "2",
    ]  # fmt: skip # why: flag and value pairs, as the pod's command line reads
    assert args[args.index("--tensor-parallel-size") + 1] == "8"
    assert leader["spec"]["containers"][0]["args"][args.index("--node-rank") + 1] == "0"
    # each pod holds gpusPerReplica GPUs; the group holds K times that
    assert worker["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    # workers serve /livez only, so that is their readiness; the leader's covers the group
    assert worker["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/livez"
    assert leader["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] != "/livez"


@pytest.mark.parametrize(
    ("gpus", "split"),
    [
        (4, ["--tensor-parallel-size", "8"]),
        (1, ["--pipeline-parallel-size", "2"]),
        (0, ["--pipeline-parallel-size", "2"]),
    ],
)
def test_the_hf_engine_spans_nodes_one_way_at_a_time(gpus, split):
    """Pipeline stages across the nodes of one-GPU or CPU pods; one tensor-parallel group over all the GPUs
    otherwise (hf does not combine the two)."""
    spec = target(engine="hf", gpusPerReplica=gpus)
    args = builders.pod(spec, "llama", "ml", 0, IMAGE, "", 1)["spec"]["containers"][0]["args"]
    assert [a for a in args if a.endswith("-parallel-size")] == split[:1]
    assert args[args.index(split[0]) + 1] == split[1] and args[args.index("--nnodes") + 1] == "2"


@pytest.mark.parametrize("given", [["--tensor-parallel-size", "2"], ["--pipeline-parallel-size", "2"]])
def test_an_hf_split_in_args_replaces_the_default_one(given):
    spec = target(engine="hf", gpusPerReplica=1, args=given)
    args = builders.pod(spec, "llama", "ml", 0, IMAGE, "", 1)["spec"]["containers"][0]["args"]
    assert [a for a in args if a.endswith("-parallel-size")] == given[:1]


def test_args_that_set_a_split_win_and_a_recreated_group_keeps_its_leader_address():
    spec = target(args=["--pipeline-parallel-size", "1", "--tensor-parallel-size", "16"])
    args = builders.pod(spec, "llama", "ml", 0, IMAGE, "llama-0-r1", 1)["spec"]["containers"][0]["args"]
    assert args.count("--pipeline-parallel-size") == 1 and args.count("--tensor-parallel-size") == 1
    assert args[args.index("--master-addr") + 1] == LEADER_DNS  # hostname is by ordinal, not by pod name


def test_ranks_of_one_group_must_land_on_distinct_nodes_beside_the_users_affinity():
    user = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}
    pod = builders.pod(target(affinity=user), "llama", "ml", 1, IMAGE, "llama-1", 1)
    affinity = pod["spec"]["affinity"]
    assert affinity["nodeAffinity"] == user["nodeAffinity"]
    template = {"spec": {"affinity": user}}
    templated = builders.pod(target(podTemplate=template), "llama", "ml", 1, IMAGE, "llama-1", 0)["spec"][
        "affinity"
    ]
    assert (
        templated["podAntiAffinity"] == affinity["podAntiAffinity"]
        and templated["nodeAffinity"] == user["nodeAffinity"]
    )
    assert affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
        {
            "labelSelector": {"matchLabels": {groups.GROUP_LABEL: "llama-1"}},
            "topologyKey": "kubernetes.io/hostname",
        }
    ]


def test_host_network_ranks_of_a_group_declare_the_groups_host_ports():
    spec = target(hostNetwork=True, replicas=2)
    for ordinal in (0, 1):
        ports = {
            p["hostPort"]
            for rank in (0, 1)
            for p in builders.pod(spec, "llama", "ml", ordinal, IMAGE, "", rank)["spec"]["containers"][0][
                "ports"
            ]
        }
        assert min(ports) == 8001 + ordinal and len(ports) == 1 + 8
    assert spec.problems() == []


def test_only_leaders_are_endpoints_and_the_budget_lets_one_group_break_at_a_time():
    spec = target(replicas=3)
    children = {c["kind"] + "/" + c["metadata"]["name"]: c for c in discovery.children(spec, "llama", "ml")}
    assert children["Service/llama"]["spec"]["selector"][groups.ROLE_LABEL] == "leader"
    assert groups.ROLE_LABEL not in children["Service/llama-peers"]["spec"]["selector"]
    assert children["ConfigMap/llama-client"]["data"] == discovery.client_env(
        spec, "llama", "ml"
    )  # the Service
    budget = children["PodDisruptionBudget/llama"]["spec"]
    assert budget["minAvailable"] == 3 * 2 - 1 and "maxUnavailable" not in budget
    assert budget["selector"]["matchLabels"] == builders.selector("llama")
    assert groups.budget(target(replicas=3, disruption={"minAvailable": 2})) == {"minAvailable": 5}
    assert builders.selector_string("llama", spec).endswith(f"{groups.ROLE_LABEL}=leader")


def test_specs_that_cannot_form_groups_are_refused():
    assert "nodesPerReplica must be at least 1" in target(nodesPerReplica=0).problems()
    assert any("cannot span 2 nodes" in p for p in target(engine="sglang").problems())
    assert (
        "groupScheduleTimeoutSeconds must be at least 1" in target(groupScheduleTimeoutSeconds=0).problems()
    )
    surge = target(updateStrategy={"maxSurge": "25%"}).problems()
    assert any(p.startswith("updateStrategy.maxSurge must be 0 with nodesPerReplica > 1") for p in surge)
    assert target(updateStrategy={"maxSurge": 0, "maxUnavailable": "50%"}, replicas=2).problems() == []


def plan(pods, replicas=2, now=100.0, **kw):
    return plan_groups("llama", pods, Rollout(replicas, "rev"), 2, now=now, grace=300.0, **kw)


def test_missing_groups_are_created_whole_and_whole_groups_left_alone():
    step = plan(whole(0)).plan
    assert step.create == [(1, "llama-1")] and step.delete == []


def test_a_deleted_worker_takes_its_whole_group_down_before_it_is_recreated():
    pods = whole(0) + [member(1, 0)]  # llama-1-w1 was deleted
    step = plan(pods).plan
    assert step.delete == ["llama-1"] and step.create == []
    leaving = [dataclasses.replace(member(1, 0), terminating=True, deadline=120.0)]
    assert plan(whole(0) + leaving).plan.create == []  # waits until the group is gone
    assert plan(whole(0)).plan.create == [(1, "llama-1")]


@pytest.mark.parametrize("phase", ["Failed", "Succeeded"])
def test_a_failed_or_evicted_pod_takes_its_whole_group_down(phase):
    pods = whole(0) + [member(1, 0), member(1, 1, phase=phase, ready=False)]
    assert sorted(plan(pods).plan.delete) == ["llama-1", "llama-1-w1"]


def test_a_lost_node_takes_the_group_down_and_the_lost_pod_is_left_to_the_force_delete():
    pods = whole(0) + whole(1)
    assert plan(pods, lost=frozenset({"llama-1-w1"})).plan.delete == ["llama-1"]


def test_a_group_not_placed_in_time_gives_its_pods_back_and_is_held():
    unbound = member(
        1,
        1,
        bound=False,
        ready=False,
        phase="Pending",
        failing_reason="Unschedulable",
        failing_message="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    )
    pods = whole(0) + [member(1, 0, ready=False), unbound]
    assert plan(pods, now=599.0).plan.delete == []
    result = plan(pods, now=600.0)
    assert sorted(result.plan.delete) == ["llama-1", "llama-1-w1"]
    retry, why = result.given_back[1]
    assert retry == 1200.0 and "1 of 2 pods not scheduled within 600 s: 3 Insufficient nvidia.com/gpu" in why
    assert plan(whole(0), now=700.0, held={1: retry}).plan.create == []
    assert plan(whole(0), now=1200.0, held={1: retry}).plan.create == [(1, "llama-1")]


def test_rollouts_and_scale_down_go_group_by_group():
    old = whole(0, spec_hash="old") + whole(1, spec_hash="old")
    step = plan_groups("llama", old, Rollout(2, "rev", 0, 1), 2, now=0.0, grace=300.0).plan
    assert sorted(step.delete) == ["llama-1", "llama-1-w1"]  # one group at a time, highest ordinal first
    partitioned = plan_groups("llama", old, Rollout(2, "rev", 0, 1, partition=2), 2, now=0.0, grace=300.0)
    assert partitioned.plan.delete == []
    assert sorted(plan(whole(0) + whole(1) + whole(2), replicas=2).plan.delete) == ["llama-2", "llama-2-w1"]


def test_status_and_scale_count_groups_and_list_leaders_only():
    pods = whole(0) + [member(1, 0), member(1, 1, ready=False)]
    states = plan(pods).states
    status = compute_status(
        name="llama", pods=states, observed=Observed(rollout=Rollout(2, "rev")),
        selector=builders.selector_string("llama", target()), previous=None, at=0.0,
    )  # fmt: skip # why: two lines of keywords, not one a line
    assert (status["replicas"], status["readyReplicas"], status["updatedReplicas"]) == (2, 1, 2)
    assert status["endpoints"] == ["10.0.0.1:8001"]
    assert status["selector"].endswith(f"{groups.ROLE_LABEL}=leader")


def test_a_given_back_group_is_the_ready_reason_and_the_wait_column():
    observed = Observed(rollout=Rollout(2, "rev"), given_back="group llama-1: 1 of 2 pods not scheduled")
    status = compute_status(
        name="llama", pods=plan(whole(0)).states, observed=observed, selector="", previous=None
    )
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "GroupUnschedulable")
    assert status["waiting"].startswith("group llama-1")
