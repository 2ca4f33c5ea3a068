"""Pure builders and decisions: spec parsing and checks, children, rollout planning, conditions."""

from __future__ import annotations

import pytest
from pod_state_support import pod_state

from eagle3_target.operator import builders, discovery
from eagle3_target.operator.planner import PodState, Rollout, plan
from eagle3_target.operator.status import Observed, compute_status, merge_conditions
from eagle3_target.operator.target_spec import InvalidSpec, TargetSpec

IMAGE = "registry.test/eagle3-target:test"


def target(**spec) -> TargetSpec:
    return TargetSpec.parse({"model": "org/model", **spec})


def test_pod_runs_serve_with_probes_gpu_limit_and_restricted_security():
    spec = target(
        auxLayerIds=[2, 10, 20], authTokenSecret={"name": "tok"}, resources={"limits": {"memory": "8Gi"}}
    )
    pod = builders.pod(spec, "llama", "ml", 0, IMAGE)
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["eagle3-target", "serve"]
    assert container["args"] == [
        "--model",
        "org/model",
        "--engine",
        "hf",
        "--dtype",
        "auto",
        "--device",
        "cuda",
        "--host",
        "$(POD_IPS)",
        "--port",
        "8001",
        "--nccl-port-range",
        "29600-29607",
        "--drain-timeout",
        "30",
        "--aux-layer-ids",
        "2,10,20",
        "--auth-token-file",
        "/var/run/eagle3-target/token",
        "--admin-token-file",
        "/var/run/eagle3-target-admin/token",
    ]
    assert pod["spec"]["terminationGracePeriodSeconds"] >= 30 + 10  # the drain, and time to exit after it
    assert container["resources"]["limits"] == {"memory": "8Gi", "nvidia.com/gpu": 1}
    assert container["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"] == 1800
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["spec"]["automountServiceAccountToken"] is False
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["EAGLE3_TARGET_HTTP_PORT"] == "8001" and env["EAGLE3_TARGET_NCCL_PORT_RANGE"] == "29600-29607"
    secret = next(v for v in pod["spec"]["volumes"] if v["name"] == "auth-token")["secret"]
    assert secret == {"secretName": "tok", "items": [{"key": "token", "path": "token"}]}
    assert "hostNetwork" not in pod["spec"]


def test_cpu_target_has_no_gpu_limit_and_runs_on_cpu():
    container = builders.pod(target(gpusPerReplica=0), "t", "ml", 0, IMAGE)["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert container["args"][container["args"].index("--device") + 1] == "cpu"


def test_host_network_gives_each_ordinal_its_own_ports():
    spec = target(
        hostNetwork=True,
        replicas=8,
        ports={"http": 8100, "nccl": {"start": 29500, "end": 29563, "perReplica": 8}},
    )
    assert spec.problems() == []
    seen: set[int] = set()
    for ordinal in range(8):
        pod = builders.pod(spec, "t", "ml", ordinal, IMAGE)
        ports = pod["spec"]["containers"][0]["ports"]
        assert all(p["hostPort"] == p["containerPort"] for p in ports)
        numbers = {p["containerPort"] for p in ports}
        assert not numbers & seen  # eight one-GPU pods can share one node
        seen |= numbers
        assert ports[0] == {
            "name": "http",
            "containerPort": 8100 + ordinal,
            "protocol": "TCP",
            "hostPort": 8100 + ordinal,
        }
        assert pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"


def test_pod_template_depends_on_ordinal_not_on_replicas():
    one, three = target(replicas=1), target(replicas=3)
    assert builders.pod(one, "t", "ml", 0, IMAGE) == builders.pod(three, "t", "ml", 0, IMAGE)
    changed = builders.pod(target(dtype="bfloat16"), "t", "ml", 0, IMAGE)
    key = builders.HASH_ANNOTATION
    assert (
        changed["metadata"]["annotations"][key]
        != builders.pod(one, "t", "ml", 0, IMAGE)["metadata"]["annotations"][key]
    )


def test_revision_covers_what_the_user_wrote_not_defaults_or_rollout_settings():
    base = builders.revision(target())
    assert builders.revision(target(dtype="auto", engine="hf", ports={"http": 8001})) == base  # defaults
    rollout_only = {
        "replicas": 7,
        "progressDeadlineSeconds": 60,
        "updateStrategy": {"maxSurge": 2, "partition": 1},
    }
    assert builders.revision(target(**rollout_only)) == base
    for change in ({"dtype": "bfloat16"}, {"image": "mine:1"}, {"args": ["--x"]}, {"ports": {"http": 9000}}):
        assert builders.revision(target(**change)) != base, change
    # the operator's default image is not part of it: a new default restarts nothing
    assert (
        builders.pod(target(), "t", "ml", 0, "a:1")["metadata"]["annotations"]
        == (builders.pod(target(), "t", "ml", 0, "b:2")["metadata"]["annotations"])
    )


def test_services_are_headless_with_named_ports_and_configmap_points_at_srv():
    spec = target()
    service, peers, configmap, _ = discovery.children(spec, "llama", "ml")
    for svc in (service, peers):
        assert svc["spec"]["clusterIP"] == "None"
        assert [(p["name"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
            ("http", "http"),
            ("nccl", "nccl"),
        ]
        assert svc["spec"]["selector"] == builders.selector("llama")
    # false is left out: the server drops it, and what it drops would read as drift (tests/cluster proves it)
    assert (
        "publishNotReadyAddresses" not in service["spec"]
        and peers["spec"]["publishNotReadyAddresses"] is True
    )
    assert peers["metadata"]["name"] == "llama-peers"
    assert configmap["metadata"]["name"] == "llama-client"
    assert configmap["data"] == {
        "EAGLE3_TARGET_SERVICE": "srv://_http._tcp.llama.ml.svc.cluster.local",
        "EAGLE3_TARGET_SERVICE_DNS": "dns://llama.ml.svc.cluster.local:8001",
    }
    labels = service["metadata"]["labels"]
    assert {
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/component",
        "app.kubernetes.io/part-of",
        "app.kubernetes.io/managed-by",
    } <= set(labels)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"auxLayerIds": [1, 1, 2]}, "duplicates"),
        ({"hostNetwork": True, "replicas": 40}, "too small"),
        ({"ports": {"nccl": {"start": 29600, "end": 29500}}}, "below"),
        ({"ports": {"http": 29601}}, "overlap"),
        ({"engine": "sglang", "gpusPerReplica": 0}, "sglang"),
        ({"engine": "tgi"}, "engine"),
        ({"disruption": {"maxUnavailable": 1, "minAvailable": 1}}, "not both"),
        ({"disruption": {"maxUnavailable": -1}}, "negative"),
        ({"replicas": 2, "disruption": {"maxUnavailable": 3}}, "larger than replicas 2"),
        ({"nodeFailureToleranceSeconds": -1}, "nodeFailureToleranceSeconds"),
        ({"modelVolume": {"mountPath": "/m"}}, "modelVolume"),
        ({"hostNetwork": True, "replicas": 3, "ports": {"http": 65534}}, "65535"),
    ],
)
def test_semantic_problems_are_named(spec, fragment):
    problems = target(**spec).problems()
    assert problems and any(fragment in p for p in problems), problems


def test_malformed_spec_raises_invalid_spec():
    with pytest.raises(InvalidSpec):
        TargetSpec.parse({"model": "m", "replicas": "many"})
    with pytest.raises(InvalidSpec):
        TargetSpec.parse({})


def rollout(replicas: int, **kw) -> Rollout:
    return Rollout(replicas=replicas, revision="new", **kw)


def test_plan_creates_missing_and_deletes_extras_highest_first():
    step = plan("t", [pod_state(0), pod_state(3), pod_state(5)], rollout(3))
    assert step.create == [(1, "t-1"), (2, "t-2")]
    assert step.delete == ["t-5", "t-3"]


def test_plan_rolls_one_outdated_pod_only_when_the_rest_is_ready():
    pods = [pod_state(0, "old"), pod_state(1, "old"), pod_state(2, "old")]
    assert plan("t", pods, rollout(3)).delete == ["t-2"]
    waiting = [pod_state(0, "old"), pod_state(1, "old"), pod_state(2, "new", ready=False)]
    assert plan("t", waiting, rollout(3)).delete == []
    missing = [pod_state(0, "old"), pod_state(1, "old")]
    step = plan("t", missing, rollout(3))
    assert step.delete == [] and step.create == [(2, "t-2")]
    broken_old = [pod_state(0, "old"), pod_state(1, "old", ready=False), pod_state(2, "new")]
    assert plan("t", broken_old, rollout(3)).delete == [
        "t-1"
    ]  # an unready outdated pod costs no availability


def test_plan_surges_within_bounds_and_retires_old_pods_once_new_ones_are_ready():
    old = [pod_state(i, "old") for i in range(4)]
    surge = rollout(4, max_surge=1, max_unavailable=0)
    assert plan("t", old, surge).create == [(3, "t-3-r1")] and plan("t", old, surge).delete == []
    loading = [*old, pod_state(3, "new", ready=False, name="t-3-r1")]
    assert plan("t", loading, surge).create == [] and plan("t", loading, surge).delete == []
    ready = [*old, pod_state(3, "new", name="t-3-r1")]
    step = plan("t", ready, surge)
    assert step.delete == ["t-3"] and step.create == [(2, "t-2-r1")]
    wide = rollout(4, max_surge=0, max_unavailable=2)
    assert plan("t", old, wide).delete == ["t-3", "t-2"]


def test_plan_partition_updates_only_high_ordinals():
    pods = [pod_state(i, "old") for i in range(3)]
    assert plan("t", pods, rollout(3, partition=2)).delete == ["t-2"]
    done = [pod_state(0, "old"), pod_state(1, "old"), pod_state(2, "new")]
    assert plan("t", done, rollout(3, partition=2)) == plan("t", [], rollout(0))  # nothing to do


def test_plan_waits_for_terminating_pods_until_they_are_abandoned():
    pods = [pod_state(0, "old"), pod_state(1, "new", terminating=True, deadline=100.0)]
    step = plan("t", pods, rollout(2), now=150.0, grace=300.0)
    assert step.create == [] and step.delete == []
    step = plan("t", pods, rollout(2), now=401.0, grace=300.0)  # its node is gone: a new name, same ordinal
    assert step.create == [(1, "t-1-r1")] and step.delete == []  # t-0 waits: t-1-r1 is not ready yet
    step = plan("t", pods, rollout(2, max_unavailable=2), now=401.0, grace=300.0)
    assert step.delete == ["t-0"]  # the abandoned pod holds no rollout back


def test_plan_replaces_failed_pods():
    assert plan("t", [pod_state(0, phase="Failed", ready=False)], rollout(1)).delete == ["t-0"]


def test_pod_state_reads_readiness_ports_and_failures():
    pod = builders.pod(target(), "t", "ml", 0, IMAGE)
    pod["status"] = {
        "phase": "Running",
        "podIP": "127.0.0.2",
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    state = PodState.from_pod(pod)
    assert (state.ordinal, state.ready, state.endpoint) == (0, True, "127.0.0.2:8001")
    assert state.spec_hash == pod["metadata"]["annotations"][builders.HASH_ANNOTATION]
    pod["status"]["containerStatuses"] = [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}]
    assert PodState.from_pod(pod).failing_reason == "CrashLoopBackOff"
    pod["status"] = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}
        ],
    }
    state = PodState.from_pod(pod)
    assert (state.failing_reason, state.failing_message) == ("Unschedulable", "0/3 nodes")


def test_last_transition_time_moves_only_when_status_flips():
    before = [
        {
            "type": "Ready",
            "status": "False",
            "reason": "PodsStarting",
            "lastTransitionTime": "T0",
            "observedGeneration": 1,
        }
    ]
    same = merge_conditions(before, [{"type": "Ready", "status": "False", "reason": "ModelLoading"}], "T1")
    assert same[0]["lastTransitionTime"] == "T0" and same[0]["reason"] == "ModelLoading"
    flipped = merge_conditions(
        before, [{"type": "Ready", "status": "True", "reason": "AllTargetsReady"}], "T2"
    )
    assert flipped[0]["lastTransitionTime"] == "T2"
    # the CRD's placeholder (no observedGeneration, 1970) is never carried over
    placeholder = [{"type": "Reconciling", "status": "True", "lastTransitionTime": "1970-01-01T00:00:00Z"}]
    merged = merge_conditions(placeholder, [{"type": "Reconciling", "status": "True"}], "T3")
    assert merged[0]["lastTransitionTime"] == "T3"


def test_status_counts_endpoints_and_degraded():
    pods = [pod_state(0), pod_state(1, ready=False, failing_reason="CrashLoopBackOff")]
    status = compute_status(
        name="t", pods=pods, observed=Observed(rollout(2), generation=4), selector="s", previous=None, at=0.0
    )
    assert (status["replicas"], status["readyReplicas"], status["endpoints"]) == (2, 1, ["10.0.0.2:8001"])
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "False" and conditions["Ready"]["reason"] == "CrashLoopBackOff"
    assert (conditions["Degraded"]["status"], conditions["Degraded"]["reason"]) == ("True", "PodsFailing")
    assert all(c["observedGeneration"] == 4 for c in conditions.values())
    assert all(c["lastTransitionTime"] == "1970-01-01T00:00:00Z" for c in conditions.values())
    again = compute_status(
        name="t",
        pods=pods,
        observed=Observed(rollout(2), generation=4),
        selector="s",
        previous=status,
        at=5.0,
    )
    assert again == status  # an unchanged world is not re-patched


@pytest.mark.parametrize(
    "pods, problems, reconciling, stalled",
    [
        ([pod_state(0), pod_state(1)], [], "False", "False"),  # all ready: kstatus Current
        ([pod_state(0), pod_state(1, ready=False)], [], "True", "False"),  # loading: InProgress
        ([pod_state(0)], [], "True", "False"),  # a replica still to create
        ([], ["auxLayerIds must be distinct"], "False", "True"),  # invalid: Failed, helm --wait stops
        ([pod_state(0), pod_state(1, ready=False, failing_reason="ImagePullBackOff")], [], "False", "True"),
    ],
)
def test_kstatus_conditions_follow_readiness(pods, problems, reconciling, stalled):
    observed = Observed(rollout(2), problems=problems, generation=1)
    status = compute_status(name="t", pods=pods, observed=observed, selector="s", previous=None, at=0.0)
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert (conditions["Reconciling"], conditions["Stalled"]) == (reconciling, stalled)


def test_progress_deadline_stalls_only_without_progress():
    loading = [pod_state(0), pod_state(1, ready=False)]
    observed = Observed(rollout(2), progress_deadline=60, generation=1)
    first = compute_status(name="t", pods=loading, observed=observed, selector="s", previous=None, at=0.0)
    later = compute_status(name="t", pods=loading, observed=observed, selector="s", previous=first, at=59.0)
    assert {c["type"]: c["status"] for c in later["conditions"]}["Stalled"] == "False"
    late = compute_status(name="t", pods=loading, observed=observed, selector="s", previous=later, at=61.0)
    stalled = {c["type"]: c for c in late["conditions"]}["Stalled"]
    assert (stalled["status"], stalled["reason"]) == ("True", "ProgressDeadlineExceeded")
    progress = [pod_state(0), pod_state(1)]
    done = compute_status(name="t", pods=progress, observed=observed, selector="s", previous=late, at=62.0)
    assert {c["type"]: c["status"] for c in done["conditions"]}["Stalled"] == "False"
