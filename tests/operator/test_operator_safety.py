"""The real operator against kmock, on what a real cluster does to it: deletion without the operator,
refused pods, dead nodes, operator upgrades, Deployment-like rollouts, failures that need a human."""

from __future__ import annotations

import asyncio

import kmock

from .operator_support import SPEC, condition, kubelet, ready_all


def rolled_out(target: dict, generation: int) -> bool:
    status = target.get("status", {})
    return (
        status.get("observedGeneration") == generation
        and status.get("updatedReplicas") == target["spec"]["replicas"]
        and condition(target, "Ready")["status"] == "True"
    )


async def test_no_finalizer_and_deletion_never_waits_for_the_operator(operator):
    """(Controller references, blockOwnerDeletion and the legacy finalizer's removal: tests/cluster.)"""
    await operator.create_target("fresh", {**SPEC, "replicas": 1})
    await operator.eventually(lambda: "fresh-0" in operator.pods())
    await asyncio.sleep(0.6)  # a few resyncs: still nothing of ours
    assert not operator.target("fresh")["metadata"].get("finalizers")
    await operator.delete_target("fresh")  # gone at once: nothing waits for the operator
    assert "fresh" not in operator.targets()


async def test_pods_are_watched_by_label_and_their_events_drive_the_status(cluster, start_operator):
    await start_operator(interval=3600)  # no resync during the test: only events move it
    await cluster.create_target("llama", SPEC)
    await ready_all(cluster, 2)
    await cluster.set_pod_ready("llama-1", "127.0.0.3", ready=False)
    await cluster.eventually(lambda: cluster.target("llama")["status"]["readyReplicas"] == 1)
    await cluster.delete("pods", "llama-0")
    await cluster.eventually(lambda: "llama-0" in cluster.pods())  # healed by the pod's deletion event

    pod_reads = [
        r
        for r in cluster.kube
        if r.resource == kmock.resource("v1/pods") and r.action in (kmock.action.LIST, kmock.action.WATCH)
    ]
    assert pod_reads and all(
        r.params.get("labelSelector") == "app.kubernetes.io/managed-by=eagle3-target-operator"
        for r in pod_reads
    )


async def test_refused_pod_is_reported_and_the_other_ordinals_are_created(operator):
    operator.kube.refusals["llama-0"] = kmock.KubernetesError(
        status=403,
        reason="Forbidden",
        message='pods "llama-0" is forbidden: violates PodSecurity "restricted:latest"',
    )
    await operator.create_target("llama", {**SPEC, "replicas": 3})
    await operator.eventually(lambda: sorted(operator.pods()) == ["llama-1", "llama-2"])

    def reported():
        ready = condition(operator.target("llama"), "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "FailedCreate")
        assert "violates PodSecurity" in ready["message"] and "llama-0" in ready["message"]
        return ready

    await operator.eventually(reported)
    events = await operator.eventually(
        lambda: [e for e in operator.events() if e["reason"] == "FailedCreate"]
    )
    assert events[0]["type"] == "Warning" and "violates PodSecurity" in events[0]["message"]
    assert events[0]["involvedObject"]["name"] == "llama"
    await asyncio.sleep(0.6)  # retried each resync, announced once
    assert len([e for e in operator.events() if e["reason"] == "FailedCreate"]) == 1

    del operator.kube.refusals["llama-0"]  # the namespace got relabelled
    await operator.eventually(lambda: "llama-0" in operator.pods())
    await operator.eventually(lambda: condition(operator.target("llama"), "Degraded")["status"] == "False")


async def test_pod_stuck_terminating_is_replaced_under_a_new_name(cluster, start_operator):
    await start_operator(stuck_pod_grace=0)
    await cluster.create_target("llama", SPEC)
    uids = await ready_all(cluster, 2)
    # its node died: the kubelet never confirms the deletion (a finalizer stands in for that)
    await cluster.patch_pod("llama-1", {"metadata": {"finalizers": ["test/dead-node"]}})
    await cluster.delete("pods", "llama-1")

    def replaced():
        pods = cluster.pods()
        assert pods["llama-1"]["metadata"].get("deletionTimestamp")
        new = [p for p in pods.values() if p["metadata"]["name"] not in ("llama-0", "llama-1")]
        assert len(new) == 1, sorted(pods)
        return new[0]

    new = await cluster.eventually(replaced)
    assert new["metadata"]["name"] == "llama-1-r1" and new["metadata"]["labels"]["eagle3.dev/ordinal"] == "1"
    assert new["spec"]["hostname"] == "llama-1"  # the ordinal is the identity, the pod name is not
    await cluster.set_pod_ready("llama-1-r1", "127.0.0.4")

    # a rollout goes on past the stuck pod
    await cluster.patch_target("llama", {"spec": {"dtype": "bfloat16"}})
    stop = asyncio.Event()
    task = asyncio.create_task(kubelet(cluster, stop))
    try:
        await cluster.eventually(lambda: rolled_out(cluster.target("llama"), generation=2), timeout=30)
    finally:
        stop.set()
        await task
    assert uids["llama-0"] not in {p["metadata"]["uid"] for p in cluster.pods().values()}
    assert "llama-1" in cluster.pods()  # still stuck, and in nobody's way


async def test_operator_upgrade_restarts_nothing_and_a_spec_change_takes_the_new_default(
    cluster, start_operator
):
    old = await start_operator(default_image="registry.test/eagle3-target:1.0")
    await cluster.create_target("llama", SPEC)
    uids = await ready_all(cluster, 2)
    assert cluster.target("llama")["status"]["image"] == "registry.test/eagle3-target:1.0"
    await old.stop()

    await start_operator(default_image="registry.test/eagle3-target:2.0")
    await cluster.set_pod_ready("llama-1", "127.0.0.3", ready=False)  # something to react to
    await cluster.eventually(lambda: cluster.target("llama")["status"]["readyReplicas"] == 1)
    await cluster.set_pod_ready("llama-1", "127.0.0.3")
    await asyncio.sleep(1.0)  # five resyncs
    assert {n: p["metadata"]["uid"] for n, p in cluster.pods().items()} == uids
    assert cluster.target("llama")["status"]["image"] == "registry.test/eagle3-target:1.0"

    await cluster.patch_target("llama", {"spec": {"dtype": "bfloat16"}})
    stop = asyncio.Event()
    task = asyncio.create_task(kubelet(cluster, stop))
    try:
        await cluster.eventually(
            lambda: cluster.target("llama")["status"]["image"] == "registry.test/eagle3-target:2.0"
        )
        await cluster.eventually(lambda: rolled_out(cluster.target("llama"), generation=2), timeout=30)
    finally:
        stop.set()
        await task
    images = {p["spec"]["containers"][0]["image"] for p in cluster.pods().values()}
    assert images == {"registry.test/eagle3-target:2.0"}


async def test_surge_rollout_keeps_every_replica_ready_and_one_extra_pod_at_most(operator):
    spec = {**SPEC, "replicas": 4, "updateStrategy": {"maxSurge": 1, "maxUnavailable": 0}}
    await operator.create_target("llama", spec)
    uids = await ready_all(operator, 4)
    start = len(operator.kube.pod_history)
    await operator.patch_target("llama", {"spec": {"image": "registry.test/eagle3-target:next"}})
    stop = asyncio.Event()
    task = asyncio.create_task(kubelet(operator, stop))
    try:

        def rolled():
            pods = operator.pods().values()
            assert len(pods) == 4 and all(p["spec"]["containers"][0]["image"].endswith(":next") for p in pods)
            return rolled_out(operator.target("llama"), generation=2)

        await operator.eventually(rolled, timeout=40)
    finally:
        stop.set()
        await task
    history = operator.kube.pod_history[start:]
    assert max(total for total, _ in history) == 5  # it did surge
    assert all(total <= 5 for total, _ in history) and all(ready >= 4 for _, ready in history), history
    assert not set(uids.values()) & {p["metadata"]["uid"] for p in operator.pods().values()}
    await operator.eventually(
        lambda: condition(operator.target("llama"), "Progressing")["reason"] == "RolloutComplete"
    )


async def test_partition_updates_only_the_ordinals_at_or_above_it(operator):
    spec = {**SPEC, "replicas": 3, "updateStrategy": {"partition": 2}}
    await operator.create_target("llama", spec)
    uids = await ready_all(operator, 3)
    await operator.patch_target("llama", {"spec": {"dtype": "bfloat16"}})
    new = await operator.eventually(
        lambda: (
            operator.pods().get("llama-2", {}).get("metadata", {}).get("uid") not in (None, uids["llama-2"])
            and operator.pods()["llama-2"]
        )
    )
    assert "bfloat16" in new["spec"]["containers"][0]["args"]
    await operator.set_pod_ready("llama-2", "127.0.0.4")
    await operator.eventually(lambda: condition(operator.target("llama"), "Ready")["status"] == "True")
    await asyncio.sleep(0.6)
    assert {n: operator.pods()[n]["metadata"]["uid"] for n in ("llama-0", "llama-1")} == {
        n: uids[n] for n in ("llama-0", "llama-1")
    }
    assert operator.target("llama")["status"]["updatedReplicas"] == 1


async def test_unschedulable_pod_stalls_at_once_with_the_schedulers_message(operator):
    await operator.create_target("llama", SPEC)
    await operator.eventually(lambda: len(operator.pods()) == 2)
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    await operator.set_pod_status(
        "llama-1",
        {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
            ],
        },
    )

    def stalled():
        cond = condition(operator.target("llama"), "Stalled")
        assert (cond["status"], cond["reason"]) == ("True", "Unschedulable") and message in cond["message"]
        assert condition(operator.target("llama"), "Reconciling")["status"] == "False"
        return cond

    await operator.eventually(stalled)
    await operator.set_pod_status(
        "llama-1",
        {
            "containerStatuses": [
                {
                    "name": "server",
                    "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling"}},
                }
            ],
            "conditions": [{"type": "PodScheduled", "status": "True"}],
        },
    )
    await operator.eventually(
        lambda: condition(operator.target("llama"), "Stalled")["reason"] == "ImagePullBackOff"
    )


async def test_progress_deadline_stalls_a_fleet_that_stops_moving(operator):
    await operator.create_target("llama", {**SPEC, "progressDeadlineSeconds": 1})
    await operator.eventually(lambda: len(operator.pods()) == 2)

    def exceeded():
        cond = condition(operator.target("llama"), "Stalled")
        assert (cond["status"], cond["reason"]) == ("True", "ProgressDeadlineExceeded")
        return cond

    await operator.eventually(exceeded, timeout=20)
    await ready_all(operator, 2)
    assert condition(operator.target("llama"), "Stalled")["status"] == "False"


async def test_condition_times_are_real_and_a_deleted_targets_state_is_dropped(cluster, start_operator):
    running = await start_operator()
    crd_default = {  # what the API server fills in from the CRD before the operator writes anything
        "conditions": [
            {
                "type": "Reconciling",
                "status": "True",
                "reason": "Pending",
                "lastTransitionTime": "1970-01-01T00:00:00Z",
            },
            {
                "type": "Ready",
                "status": "Unknown",
                "reason": "Pending",
                "lastTransitionTime": "1970-01-01T00:00:00Z",
            },
        ]
    }
    await cluster.create_target("llama", SPEC, status=crd_default)
    await cluster.eventually(lambda: condition(cluster.target("llama"), "Ready")["reason"] != "Pending")
    for cond in cluster.target("llama")["status"]["conditions"]:
        assert cond["lastTransitionTime"] > "2020", cond

    for i in range(5):
        await cluster.create_target(f"t{i}", {**SPEC, "replicas": 0})
    # the CRD's default status is there from the start: wait for the operator's own
    await cluster.eventually(
        lambda: all(cluster.target(f"t{i}")["status"].get("observedGeneration") for i in range(5))
    )
    assert len(running.memo.targets) == 6
    for i in range(5):
        await cluster.delete_target(f"t{i}")
    await cluster.eventually(lambda: list(running.memo.targets) == [(cluster.namespace, "llama")])


async def test_a_name_too_long_for_its_services_gets_a_condition_and_no_children(operator):
    """Where the CRD's CEL rule did not run (an older CRD, or kmock): the operator refuses it itself."""
    name = "a" * 60  # <name>-peers would be 66 characters: the API server would reject that Service
    await operator.create_target(name, {**SPEC, "replicas": 1})

    def refused():
        stalled = condition(operator.target(name), "Stalled")
        assert (stalled["status"], stalled["reason"]) == ("True", "InvalidSpec")
        assert "at most 57" in stalled["message"]
        return stalled

    await operator.eventually(refused)
    await operator.eventually(lambda: [e for e in operator.events() if e["reason"] == "InvalidSpec"])
    assert operator.pods() == {} and operator.services() == {}
