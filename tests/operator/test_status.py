"""The status block from observed pods: each condition's status, reason and message in every state of the fleet,
the wait column, the progress deadline, and which times move between reconciles."""

from __future__ import annotations

import datetime
import time

import pytest
from pod_state_support import pod_state as pod

from eagle3_target.operator.planner import PodState, Rollout
from eagle3_target.operator.status import (
    Observed,
    compute_status,
    format_time,
    merge_conditions,
    waiting,
    waiting_detail,
)

SCHEDULER = (
    "0/20 nodes are available: 20 Insufficient nvidia.com/gpu. preemption: 0/20 nodes are available: "
    "20 No preemption victims found for incoming pod."
)


def status(pods: list[PodState], replicas=2, previous=None, at=0.0, image="", **observed) -> dict:
    observed.setdefault("generation", 3)
    seen = Observed(Rollout(replicas, "new"), **observed)
    return compute_status(
        name="t", pods=pods, observed=seen, selector="app=t", previous=previous, image=image, at=at
    )


def conditions(block: dict) -> dict[str, tuple[str, str, str]]:
    """Each condition as (status, reason, message), by type; each names the generation it describes."""
    assert all(c.get("observedGeneration") == block.get("observedGeneration") for c in block["conditions"])
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in block["conditions"]}


def test_a_ready_fleet_has_the_whole_block():
    block = status([pod(1), pod(0)], image="registry.test/img:1")
    for c in block["conditions"]:
        assert (c["observedGeneration"], c["lastTransitionTime"]) == (3, "1970-01-01T00:00:00Z")
    progressing = next(c for c in block["conditions"] if c["type"] == "Progressing")
    assert progressing["lastUpdateTime"] == "1970-01-01T00:00:00Z"
    assert {k: v for k, v in block.items() if k != "conditions"} == {
        "replicas": 2,
        "readyReplicas": 2,
        "updatedReplicas": 2,
        "selector": "app=t",
        "serviceName": "t",
        "endpoints": ["10.0.0.2:8001", "10.0.0.3:8001"],
        "waiting": "",
        "observedGeneration": 3,
        "revision": "new",
        "image": "registry.test/img:1",
    }
    assert conditions(block) == {
        "Ready": ("True", "AllTargetsReady", "2/2 targets ready"),
        "Progressing": ("False", "RolloutComplete", "2/2 targets ready"),
        "Degraded": ("False", "AsExpected", "no failing targets"),
        "Reconciling": ("False", "AllTargetsReady", "2/2 targets ready"),
        "Stalled": ("False", "AsExpected", "2/2 targets ready"),
        "DrainsBlocked": ("False", "AsExpected", "drains may evict this target's pods"),
    }
    assert [c["type"] for c in block["conditions"]] == list(conditions(block))


def test_without_generation_revision_or_image_those_fields_are_left_out():
    block = compute_status(
        name="t", pods=[], observed=Observed(Rollout(0, "")), selector="s", previous=None, at=0.0
    )
    assert "observedGeneration" not in block and "revision" not in block and "image" not in block
    assert all("observedGeneration" not in c for c in block["conditions"])


def test_counts_leave_out_terminating_pods_and_endpoints_only_wanted_ready_ones():
    pods = [
        pod(0),
        pod(1, "old"),
        pod(2, ready=False),
        pod(3),  # an extra (scale-down pending): counted, but no endpoint
        pod(4, terminating=True),
    ]
    block = status(pods, replicas=3)
    assert (block["replicas"], block["readyReplicas"], block["updatedReplicas"]) == (4, 3, 3)
    assert block["endpoints"] == ["10.0.0.2:8001", "10.0.0.3:8001"]


@pytest.mark.parametrize(
    "pods, replicas, ready, progressing",
    [
        (
            [],
            0,
            ("True", "ScaledToZero", "no targets requested"),
            ("False", "RolloutComplete", "0/0 targets ready"),
        ),
        (
            [pod(0)],
            2,
            ("False", "PodsStarting", "1/2 targets ready"),
            ("True", "Scaling", "1 pods, 2 wanted"),
        ),
        (
            [pod(0), pod(1, ready=False, phase="Pending")],
            2,
            ("False", "PodsStarting", "1/2 targets ready"),
            ("True", "ModelLoading", "1/2 targets ready"),
        ),
        (
            [pod(0), pod(1, ready=False)],
            2,
            ("False", "ModelLoading", "1/2 targets ready"),
            ("True", "ModelLoading", "1/2 targets ready"),
        ),
        (
            [pod(0, "old"), pod(1, "old")],
            2,
            ("False", "RollingUpdate", "2/2 targets ready"),
            ("True", "RollingUpdate", "2 pods to replace"),
        ),
        (
            [pod(0), pod(1), pod(2)],
            2,
            ("True", "AllTargetsReady", "2/2 targets ready"),
            ("True", "Scaling", "3 pods, 2 wanted"),
        ),
        (  # two pods hold ordinal 0 (a surge's new pod beside the old one): not yet done
            [pod(0), pod(0, name="t-0-r1")],
            1,
            ("False", "ModelLoading", "2/1 targets ready"),
            ("True", "Scaling", "2 pods, 1 wanted"),
        ),
    ],
)
def test_ready_and_progressing_name_the_fleets_state(pods, replicas, ready, progressing):
    found = conditions(status(pods, replicas=replicas))
    assert (found["Ready"], found["Progressing"]) == (ready, progressing)
    assert found["Reconciling"] == ("False" if ready[0] == "True" else "True", *ready[1:])
    assert found["Stalled"] == ("False", "AsExpected", ready[2])
    assert found["Degraded"] == ("False", "AsExpected", "no failing targets")


def test_a_blocked_pod_is_the_ready_reason_in_its_own_words_and_every_failing_pod_is_degraded():
    pods = [
        pod(0, failing_reason="CrashLoopBackOff"),  # ready again between restarts: not what blocks
        pod(1, ready=False, phase="Pending", failing_reason="Unschedulable", failing_message=SCHEDULER),
        pod(2, ready=False, failing_reason="ErrImagePull"),  # an extra, beyond replicas
        pod(3, ready=False, terminating=True, failing_reason="ImagePullBackOff"),
    ]
    found = conditions(status(pods))
    blocked = "1/2 targets ready; t-1: 20 Insufficient nvidia.com/gpu"
    assert found["Ready"] == ("False", "Unschedulable", blocked)
    assert found["Degraded"] == (
        "True",
        "PodsFailing",
        "t-0: CrashLoopBackOff, t-1: Unschedulable, t-2: ErrImagePull",
    )
    assert found["Stalled"] == ("True", "CrashLoopBackOff", "t-0: CrashLoopBackOff")
    assert found["Reconciling"] == ("False", "Unschedulable", blocked)


def test_a_failure_that_can_pass_degrades_without_stalling():
    evicted = pod(1, ready=False, phase="Failed", failing_reason="Evicted", failing_message="low on memory")
    found = conditions(status([pod(0), evicted]))
    assert found["Ready"] == ("False", "Evicted", "1/2 targets ready; t-1: low on memory")
    assert found["Degraded"] == ("True", "PodsFailing", "t-1: Evicted")
    assert found["Stalled"] == ("False", "AsExpected", "1/2 targets ready; t-1: low on memory")
    assert found["Reconciling"] == ("True", "Evicted", "1/2 targets ready; t-1: low on memory")


def test_a_stalled_pod_without_a_message_is_named_by_its_reason():
    pulling = pod(0, ready=False, failing_reason="ImagePullBackOff", failing_message="back-off pulling img")
    crashing = pod(1, ready=False, failing_reason="CrashLoopBackOff")
    assert conditions(status([pulling]))["Stalled"] == (
        "True",
        "ImagePullBackOff",
        "t-0: back-off pulling img",
    )
    assert conditions(status([crashing]))["Stalled"] == ("True", "CrashLoopBackOff", "t-1: CrashLoopBackOff")


def test_refused_creations_and_given_back_groups_win_over_the_pods():
    failing = [pod(0, ready=False, failing_reason="CrashLoopBackOff")]
    errors = ["t-0: forbidden", "t-1: quota exceeded"]
    refused = conditions(status(failing, create_errors=errors, given_back="t-1: no nodes"))
    assert refused["Ready"] == ("False", "FailedCreate", "t-0: forbidden; t-1: quota exceeded")
    assert refused["Degraded"] == ("True", "FailedCreate", "t-0: forbidden; t-1: quota exceeded")
    given = status(failing, given_back="group t-1 given back: " + "x" * 300)
    found = conditions(given)
    assert found["Ready"] == ("False", "GroupUnschedulable", "group t-1 given back: " + "x" * 300)
    assert found["Degraded"] == ("True", "GroupUnschedulable", "group t-1 given back: " + "x" * 300)
    assert given["waiting"] == ("group t-1 given back: " + "x" * 300)[:200]
    assert conditions(status([], replicas=0, create_errors=errors))["Ready"][1] == "ScaledToZero"


def test_an_invalid_spec_stalls_every_condition_on_its_problems():
    block = status([pod(0)], problems=["replicas must be >= 0", "model is empty"])
    message = "replicas must be >= 0; model is empty"
    assert conditions(block) == {
        "Ready": ("False", "InvalidSpec", message),
        "Progressing": ("False", "InvalidSpec", message),
        "Degraded": ("True", "InvalidSpec", message),
        "Reconciling": ("False", "InvalidSpec", message),
        "Stalled": ("True", "InvalidSpec", message),
        "DrainsBlocked": ("False", "AsExpected", "drains may evict this target's pods"),
    }
    assert all("lastUpdateTime" not in c for c in block["conditions"])  # no deadline runs on it


def test_the_wait_column_counts_distinct_waits_of_wanted_pods_most_first():
    gpu = dict(ready=False, phase="Pending", failing_reason="Unschedulable", failing_message=SCHEDULER)
    secret = dict(
        ready=False, failing_reason="CreateContainerConfigError", failing_message='secret "s" not found'
    )
    pods = [
        pod(0, **secret),
        pod(1, **gpu),
        pod(2, **gpu),
        pod(7, **gpu),  # an extra
        pod(4, **gpu, terminating=True),
        pod(5, failing_reason="CrashLoopBackOff"),  # ready
        pod(6, ready=False),  # no reason
    ]
    assert (
        waiting(pods, Rollout(7, "new"))
        == '2 pods: 20 Insufficient nvidia.com/gpu; 1 pod: secret "s" not found'
    )
    assert waiting([pod(0, **gpu)], Rollout(0, "new")) == ""
    assert waiting([pod(-1, **gpu)], Rollout(1, "new")) == ""  # a pod without an ordinal label


@pytest.mark.parametrize(
    "reason, message, detail",
    [
        ("Unschedulable", SCHEDULER, "20 Insufficient nvidia.com/gpu"),
        (
            "Unschedulable",
            "0/3 nodes are available: 3 node(s) had untolerated taint.",
            "3 node(s) had untolerated taint",
        ),
        ("CrashLoopBackOff", "", "CrashLoopBackOff"),
        ("ErrImagePull", "pull access denied for registry.test/X.", "pull access denied for registry.test/X"),
        ("FailedMount", "a/b nodes are available: x.", "a/b nodes are available: x"),  # not the preamble
        ("FailedMount", "m" * 200, "m" * 160),
    ],
)
def test_the_waiting_detail_is_the_pods_own_words_without_the_schedulers_preamble(reason, message, detail):
    assert waiting_detail(pod(0, failing_reason=reason, failing_message=message)) == detail


def test_no_reason_and_no_message_is_no_detail():
    assert waiting_detail(pod(0)) == ""


def test_times_are_utc_seconds_whatever_the_hosts_zone(monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        assert format_time(0.0) == "1970-01-01T00:00:00Z"
        assert format_time(1767225600.9) == "2026-01-01T00:00:00Z"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_compute_status_without_a_time_stamps_the_present():
    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    block = compute_status(name="t", pods=[], observed=Observed(Rollout(0, "r")), selector="s", previous=None)
    stamp = datetime.datetime.fromisoformat(
        block["conditions"][0]["lastTransitionTime"].replace("Z", "+00:00")
    )
    assert before <= stamp <= datetime.datetime.now(datetime.UTC)


def test_a_condition_keeps_its_transition_time_only_with_the_same_status_and_a_time_of_its_own():
    mine = {"type": "Ready", "status": "False", "observedGeneration": 1}
    previous = [
        {**mine, "lastTransitionTime": "T0"},
        {**mine, "type": "Stalled"},  # no time: takes the new one
        {"type": "Degraded", "status": "False", "lastTransitionTime": "T0"},  # the CRD's placeholder
    ]
    current = [
        {"type": "Ready", "status": "False"},
        {"type": "Stalled", "status": "False"},
        {"type": "Degraded", "status": "False"},
        {"type": "Reconciling", "status": "True"},
    ]
    merged = merge_conditions(previous, current, "T1")
    assert [c["lastTransitionTime"] for c in merged] == ["T0", "T1", "T1", "T1"]
    assert merge_conditions(None, current[:1], "T2") == [
        {"type": "Ready", "status": "False", "lastTransitionTime": "T2"}
    ]


def test_transition_times_survive_a_reconcile_that_changes_nothing_and_move_on_a_flip():
    loading = [pod(0), pod(1, ready=False)]
    first = status(loading, at=0.0)
    second = status([pod(0), pod(1)], previous=first, at=10.0)
    times = {c["type"]: c["lastTransitionTime"] for c in second["conditions"]}
    assert times == {
        "Ready": "1970-01-01T00:00:10Z",
        "Progressing": "1970-01-01T00:00:10Z",
        "Degraded": "1970-01-01T00:00:00Z",
        "Reconciling": "1970-01-01T00:00:10Z",
        "Stalled": "1970-01-01T00:00:00Z",
        "DrainsBlocked": "1970-01-01T00:00:00Z",
    }


def progressing(block: dict) -> dict:
    return next(c for c in block["conditions"] if c["type"] == "Progressing")


def test_the_progress_deadline_counts_from_the_last_change_and_is_exclusive():
    loading = [pod(0), pod(1, ready=False)]
    first = status(loading, at=100.0, progress_deadline=60.0)
    at_deadline = status(loading, previous=first, at=160.0, progress_deadline=60.0)
    assert progressing(at_deadline)["lastUpdateTime"] == "1970-01-01T00:01:40Z"
    assert conditions(at_deadline)["Progressing"] == ("True", "ModelLoading", "1/2 targets ready")
    past = status(loading, previous=at_deadline, at=160.5, progress_deadline=60.0)
    assert conditions(past)["Progressing"] == (
        "False",
        "ProgressDeadlineExceeded",
        "no progress for 60 s: 1/2 targets ready",
    )
    assert conditions(past)["Stalled"] == (
        "True",
        "ProgressDeadlineExceeded",
        "no progress for 60 s: 1/2 targets ready",
    )
    assert conditions(past)["Reconciling"] == ("False", "ModelLoading", "1/2 targets ready")


def test_the_default_progress_deadline_is_half_an_hour():
    loading = [pod(0), pod(1, ready=False)]
    first = status(loading, at=0.0)
    assert conditions(status(loading, previous=first, at=1800.0))["Progressing"][0] == "True"
    late = conditions(status(loading, previous=first, at=1801.0))["Progressing"]
    assert late == ("False", "ProgressDeadlineExceeded", "no progress for 1800 s: 1/2 targets ready")


def test_a_finished_rollout_never_runs_out_of_time():
    first = status([pod(0), pod(1)], at=0.0, progress_deadline=60.0)
    later = status([pod(0), pod(1)], previous=first, at=1000.0, progress_deadline=60.0)
    assert conditions(later)["Progressing"] == ("False", "RolloutComplete", "2/2 targets ready")
    assert progressing(later)["lastUpdateTime"] == "1970-01-01T00:00:00Z"


@pytest.mark.parametrize("key", ["observedGeneration", "replicas", "readyReplicas", "updatedReplicas"])
def test_any_counted_change_is_progress(key):
    loading = [pod(0), pod(1, ready=False)]
    first = status(loading, at=0.0, progress_deadline=60.0)
    later = status(loading, previous={**first, key: -1}, at=100.0, progress_deadline=60.0)
    assert progressing(later)["lastUpdateTime"] == "1970-01-01T00:01:40Z"
    assert conditions(later)["Progressing"][0] == "True"


def test_a_previous_status_without_an_update_time_starts_the_clock():
    loading = [pod(0), pod(1, ready=False)]
    first = status(loading, at=0.0, progress_deadline=60.0)
    for c in first["conditions"]:
        c.pop("lastUpdateTime", None)
    later = status(loading, previous=first, at=100.0, progress_deadline=60.0)
    assert progressing(later)["lastUpdateTime"] == "1970-01-01T00:01:40Z"
    no_conditions = status(loading, previous={k: v for k, v in first.items() if k != "conditions"}, at=100.0)
    assert progressing(no_conditions)["lastUpdateTime"] == "1970-01-01T00:01:40Z"


def test_drains_blocked_says_why():
    found = conditions(status([pod(0), pod(1)], drains_blocked="maxUnavailable 0 allows no eviction"))
    assert found["DrainsBlocked"] == ("True", "NoEvictionAllowed", "maxUnavailable 0 allows no eviction")
