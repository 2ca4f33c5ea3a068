"""The real operator against kmock, on what only an emulator can inject: deletion without the operator,
refused pods (admission's 403), condition times, names too long for their Services. Stuck pods, rollouts,
upgrades and stalls run on a real API server in tests/cluster."""

from __future__ import annotations

import asyncio

import kmock

from .operator_support import SPEC, condition, ready_all


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
