"""The planner's pure functions: what the operator reads from a pod, and which pods a reconcile step creates or
deletes next (rollout order, surge and availability bounds, pods that are done or gone)."""

from __future__ import annotations

from pod_state_support import pod_state as state

from eagle3_target.operator.builders import HASH_ANNOTATION, ORDINAL_LABEL
from eagle3_target.operator.groups import GROUP_LABEL, RANK_LABEL
from eagle3_target.operator.planner import PodState, Rollout, free_name, parse_time, plan
from eagle3_target.operator.weights import READINESS_GATE, RESTARTS_ANNOTATION, VERSION_ANNOTATION

EPOCH = 1767225600.0  # 2026-01-01T00:00:00Z


def test_a_bare_pod_reads_as_pending_unready_and_without_an_ordinal():
    assert PodState.from_pod({"metadata": {"name": "x"}}) == PodState(
        name="x",
        ordinal=-1,
        spec_hash="",
        ready=False,
        ip=None,
        http_port=None,
        phase="Pending",
        terminating=False,
        failing_reason=None,
        failing_message="",
        deadline=None,
        node=None,
        node_tolerations=(),
        creating_since=None,
        group="",
        rank=0,
        created_at=None,
        bound=False,
    )


def test_a_full_pod_reads_every_field():
    labels = {ORDINAL_LABEL: "3", GROUP_LABEL: "t-3", RANK_LABEL: "2"}
    tolerations = [
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "tolerationSeconds": 30},
        {"key": "node.kubernetes.io/not-ready", "tolerationSeconds": 20},  # no effect: all of them
        {"key": "gpu-broken", "effect": ""},  # forever
        {"key": "nvidia.com/gpu", "effect": "NoSchedule"},  # does not evict
        {"effect": "NoExecute", "tolerationSeconds": 5},  # no key: every taint, not a node failure's
        {
            "key": "node.kubernetes.io/unreachable",
            "effect": "NoExecute",
            "tolerationSeconds": 60,
        },  # the last wins
    ]
    body = {
        "metadata": {
            "name": "t-3-r1",
            "labels": labels,
            "annotations": {HASH_ANNOTATION: "abc", VERSION_ANNOTATION: "v2", RESTARTS_ANNOTATION: "1"},
            "deletionTimestamp": "2026-01-01T00:01:00Z",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "nodeName": "gpu-7",
            "tolerations": tolerations,
            "readinessGates": [{"conditionType": READINESS_GATE}],
            "containers": [
                {
                    "ports": [
                        {"name": "metrics", "containerPort": 9000},
                        {"name": "http", "containerPort": 8001},
                    ]
                },
                {"ports": [{"name": "http", "containerPort": 9999}]},  # a sidecar's port is not the target's
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": "fd00::7",
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:05Z"},
            ],
            "containerStatuses": [{"name": "server", "restartCount": 1}],
        },
    }
    state = PodState.from_pod(body)
    assert state == PodState(
        name="t-3-r1",
        ordinal=3,
        spec_hash="abc",
        ready=True,
        ip="fd00::7",
        http_port=8001,
        phase="Running",
        terminating=True,
        failing_reason=None,
        deadline=EPOCH + 60,
        node="gpu-7",
        node_tolerations=(
            ("gpu-broken", None),
            ("node.kubernetes.io/not-ready", 20),
            ("node.kubernetes.io/unreachable", 60),
        ),
        group="t-3",
        rank=2,
        created_at=EPOCH,
        bound=True,
        serving=True,
        target_version="v2",
        restarts=1,
        gated=True,
    )
    assert (state.endpoint, state.group_name) == ("[fd00::7]:8001", "t-3")


def test_the_first_container_alone_names_the_http_port():
    body = {
        "metadata": {"name": "x"},
        "spec": {"containers": [{"name": "init-like"}, {"ports": [{"name": "http", "containerPort": 8001}]}]},
    }
    assert PodState.from_pod(body).http_port is None


def test_ready_needs_an_address_and_the_ready_condition():
    unready = {"phase": "Running", "podIP": "10.0.0.2", "conditions": [{"type": "Ready", "status": "False"}]}
    assert PodState.from_pod({"metadata": {"name": "x"}, "status": unready}).ready is False
    no_ip = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    assert PodState.from_pod({"metadata": {"name": "x"}, "status": no_ip}).ready is False


def test_containers_being_created_count_from_when_the_pod_was_scheduled():
    creating = {"state": {"waiting": {"reason": "ContainerCreating"}}}
    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:05Z"}

    def read(statuses: list[dict], conditions: list[dict]) -> PodState:
        body = {
            "metadata": {"name": "x"},
            "status": {"containerStatuses": statuses, "conditions": conditions},
        }
        return PodState.from_pod(body)

    assert read([creating], [scheduled]).creating_since == EPOCH + 5
    assert read([], [scheduled]).creating_since is None
    assert read([creating], [{**scheduled, "status": "False"}]).creating_since is None
    assert read([creating], [scheduled]).failing_reason is None  # creating is not failing


def test_only_an_unschedulable_pod_fails_to_schedule():
    def read(condition: dict) -> PodState:
        return PodState.from_pod({"metadata": {"name": "x"}, "status": {"conditions": [condition]}})

    gated = read({"type": "PodScheduled", "status": "False", "reason": "SchedulingGated", "message": "gates"})
    assert (gated.failing_reason, gated.failing_message) == (None, "")
    stuck = read({"type": "PodScheduled", "status": "False", "reason": "Unschedulable"})
    assert (stuck.failing_reason, stuck.failing_message) == ("Unschedulable", "")


def test_a_failed_pod_names_its_reason_over_its_containers_waits():
    crash = {
        "containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff", "message": "exit 1"}}}]
    }
    evicted = {**crash, "phase": "Failed", "reason": "Evicted", "message": "low on memory"}
    state = PodState.from_pod({"metadata": {"name": "x"}, "status": evicted})
    assert (state.phase, state.failing_reason, state.failing_message) == (
        "Failed",
        "Evicted",
        "low on memory",
    )
    bare = PodState.from_pod({"metadata": {"name": "x"}, "status": {"phase": "Failed"}})
    assert (bare.failing_reason, bare.failing_message) == ("PodFailed", "")
    running = PodState.from_pod({"metadata": {"name": "x"}, "status": {**crash, "phase": "Running"}})
    assert (running.failing_reason, running.failing_message) == ("CrashLoopBackOff", "exit 1")


def test_times_read_with_their_offset():
    assert parse_time("2026-01-01T00:00:00Z") == EPOCH
    assert parse_time("2026-01-01T02:00:00+02:00") == EPOCH
    assert parse_time("") is None and parse_time(None) is None


def test_a_terminating_pod_is_abandoned_from_its_deadline_plus_the_grace_on():
    leaving = state(0, terminating=True, deadline=100.0)
    assert not leaving.abandoned(now=399.9, grace=300.0)
    assert leaving.abandoned(now=400.0, grace=300.0)
    assert state(0, terminating=True).abandoned(now=300.0, grace=300.0)  # no deadline: counts from 0
    assert not state(0, deadline=100.0).abandoned(now=1e9, grace=0.0)  # not terminating


def test_free_names_skip_every_name_still_taken():
    assert free_name("t", 1, set()) == "t-1"
    assert free_name("t", 1, {"t-1", "t-1-r1", "t-0-r2"}) == "t-1-r2"


def test_done_pods_are_deleted_once_and_replaced_under_a_new_name():
    done = [state(0, phase="Succeeded", ready=False), state(1, phase="Failed", ready=False)]
    step = plan("t", done, Rollout(2, "new"))
    assert step.delete == ["t-0", "t-1"] and step.create == [(0, "t-0-r1"), (1, "t-1-r1")]
    extra = plan("t", [state(0), state(1, phase="Failed", ready=False)], Rollout(1, "new"))
    assert (extra.delete, extra.create) == (["t-1"], [])  # an extra that failed: one delete


def test_a_pod_loading_the_new_revision_keeps_the_old_one_at_its_ordinal():
    pods = [state(0), state(1, "old"), state(1, ready=False, name="t-1-r1")]
    step = plan("t", pods, Rollout(2, "new", max_unavailable=1))
    assert (step.create, step.delete) == ([], [])


def test_a_rollout_goes_highest_ordinal_first_and_waits_rather_than_skip_one():
    two_old = [state(0, "old"), state(1, "old"), state(2, "old"), state(2, "older", name="t-2-r1")]
    step = plan("t", two_old, Rollout(3, "new", max_unavailable=0))
    assert (step.create, step.delete) == ([], [])  # t-2's two pods cannot go yet; t-1 waits its turn


def test_an_unready_old_pods_replacement_fills_its_place_so_it_frees_no_surge():
    pods = [state(0, "old", ready=False), state(1, "old")]
    step = plan("t", pods, Rollout(2, "new", max_unavailable=0))
    assert (step.create, step.delete) == ([], ["t-0"])


def test_each_surge_pod_counts_once_against_max_surge():
    pods = [state(i, "old") for i in range(3)]
    step = plan("t", pods, Rollout(3, "new", max_surge=2, max_unavailable=0))
    assert (step.create, step.delete) == ([(2, "t-2-r1"), (1, "t-1-r1")], [])
