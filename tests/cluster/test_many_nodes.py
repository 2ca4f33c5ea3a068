"""A fleet across many nodes, on the real API server, scheduler and controllers with hollow nodes (hollow.py):
the defaults a target's pods get and how each is replaced, the wait reason in `kubectl get` with one Warning
Event, a drain that the operator's PodDisruptionBudget keeps to one replica at a time, a budget that blocks every
drain admitted and said so in a condition (the API server refusing the eviction), and a dead node whose pods are
replaced on the others. The operator runs as manifests/operator.yaml runs it (its ServiceAccount and RBAC); the
node-loss test kills a kubelet, so it runs last. Hollow nodes and the operator come from conftest.py."""

from __future__ import annotations

import json
import subprocess
import time

import yaml
from cluster.hollow import LABEL, ON_HOLLOW
from cluster.operator_process import eventually
from cluster.test_operator_identity import target
from cluster.test_operator_rollout import SELECTOR, PodWatch


def apply(kubectl, namespace: str, name: str = "llama", **spec) -> None:
    body = target(namespace, name=name, model="m", image="example.test/server:1", **{**ON_HOLLOW, **spec})
    kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(body))


def pods(kubectl, namespace: str) -> list[dict]:
    return kubectl.json("-n", namespace, "get", "pods", "-l", SELECTOR)["items"]


def serving(kubectl, namespace: str, avoid: str = "") -> list[dict]:
    def ready(p):  # Running too: a hollow kubelet can report Ready while the phase is still Pending
        status = p.get("status", {})
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))
        return ready and status.get("phase") == "Running"

    return [
        p
        for p in pods(kubectl, namespace)
        if ready(p) and not p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName") != avoid
    ]


def test_pods_get_the_defaults_and_a_podtemplate_replaces_them(hollow_operator, kubectl, namespace):
    apply(kubectl, namespace, replicas=4, gpusPerReplica=1)
    own = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}
    template = {"spec": {"topologySpreadConstraints": [], "tolerations": [own]}}
    apply(
        kubectl,
        namespace,
        name="own",
        replicas=1,
        gpusPerReplica=1,
        tolerateGpuTaint=False,
        podTemplate=template,
    )
    placed = eventually(
        lambda: len(serving(kubectl, namespace)) == 5 and pods(kubectl, namespace), timeout=90
    )
    by_target = {}
    for pod in placed:
        by_target.setdefault(pod["metadata"]["labels"]["eagle3.dev/target"], []).append(pod)
    revision = kubectl.json("-n", namespace, "get", "e3t", "llama")["status"]["revision"]
    zones = set()
    for pod in by_target["llama"]:
        spec = pod["spec"]
        assert pod["metadata"]["labels"]["eagle3.dev/revision"] == revision
        assert [c["topologyKey"] for c in spec["topologySpreadConstraints"]] == [
            "topology.kubernetes.io/zone",
            "kubernetes.io/hostname",
        ]
        assert all(c["matchLabelKeys"] == ["eagle3.dev/revision"] for c in spec["topologySpreadConstraints"])
        tolerations = {t["key"]: t for t in spec["tolerations"]}
        assert tolerations["nvidia.com/gpu"]["effect"] == "NoSchedule"
        assert tolerations["node.kubernetes.io/unreachable"]["tolerationSeconds"] == 60
        zones.add(
            kubectl.json("get", "node", spec["nodeName"])["metadata"]["labels"]["topology.kubernetes.io/zone"]
        )
    assert zones == {"zone-0", "zone-1"}, "the soft spread uses both zones"
    (own_pod,) = by_target["own"]
    assert (
        "topologySpreadConstraints" not in own_pod["spec"]
        or own_pod["spec"]["topologySpreadConstraints"] == []
    )
    tolerations = {t["key"]: t for t in own_pod["spec"]["tolerations"]}
    assert "nvidia.com/gpu" not in tolerations and "tolerationSeconds" not in tolerations[own["key"]]


def test_capacity_problems_show_in_kubectl_get_with_one_warning_event(hollow_operator, kubectl, namespace):
    apply(kubectl, namespace, replicas=2, gpusPerReplica=16)  # no hollow node has more than 8
    apply(
        kubectl,
        namespace,
        name="claim",
        replicas=1,
        gpusPerReplica=0,
        modelCache={"persistentVolumeClaim": {"claimName": "absent"}},
    )

    def row(name: str) -> str:
        return kubectl("-n", namespace, "get", "eagle3target", name, "--no-headers").stdout

    eventually(lambda: "Insufficient nvidia.com/gpu" in row("llama"), timeout=60, what="the GPU shortage")
    assert "Unschedulable" in row("llama")
    eventually(
        lambda: 'persistentvolumeclaim "absent" not found' in row("claim"), timeout=60, what="the claim"
    )
    time.sleep(5)  # several resync passes (--interval 1) later, still one event per reason
    events = kubectl.json("-n", namespace, "get", "events", "--field-selector", "involvedObject.name=llama")
    warnings = [e for e in events["items"] if e["type"] == "Warning" and e["reason"] == "Unschedulable"]
    assert len(warnings) == 1 and "Insufficient nvidia.com/gpu" in warnings[0]["message"], warnings
    degraded = next(
        c
        for c in kubectl.json("-n", namespace, "get", "e3t", "llama")["status"]["conditions"]
        if c["type"] == "Degraded"
    )
    assert degraded["status"] == "True" and degraded["message"] != "no failing targets"


def test_a_budget_that_blocks_every_drain_is_allowed_and_says_so(hollow_operator, kubectl, namespace):
    apply(kubectl, namespace, replicas=1, gpusPerReplica=1, disruption={"maxUnavailable": 0})

    def blocked():
        conditions = (
            kubectl.json("-n", namespace, "get", "e3t", "llama").get("status", {}).get("conditions", [])
        )
        found = next((c for c in conditions if c["type"] == "DrainsBlocked"), {})
        return found.get("status") == "True" and found

    condition = eventually(blocked, timeout=60, what="DrainsBlocked=True")
    assert condition["reason"] == "NoEvictionAllowed" and "allows no eviction" in condition["message"]
    assert kubectl.json("-n", namespace, "get", "pdb", "llama")["spec"]["maxUnavailable"] == 0
    eventually(lambda: serving(kubectl, namespace), timeout=90, what="the replica serving")

    def counted_healthy():  # until the disruption controller counts the pod healthy, AlwaysAllow lets it go
        status = kubectl.json("-n", namespace, "get", "pdb", "llama").get("status", {})
        return status.get("currentHealthy") == 1 and status.get("disruptionsAllowed") == 0

    def evicted_or_refused():
        """One eviction of the serving pod as last read (Running and Ready: the API server lets a Pending pod
        go whatever its budget says): preconditions (its uid and resourceVersion) make the API server decide on
        exactly that pod, never on a replacement of the same name or on one whose state changed since; such a
        conflict (409) is tried again."""
        ready = serving(kubectl, namespace)
        if len(ready) != 1 or not counted_healthy():
            return None
        meta = ready[0]["metadata"]
        before["pod"] = (meta["uid"], meta["resourceVersion"], ready[0]["status"].get("phase"))
        eviction = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": meta["name"], "namespace": namespace},
            "deleteOptions": {
                "preconditions": {"uid": meta["uid"], "resourceVersion": meta["resourceVersion"]}
            },
        }
        path = f"/api/v1/namespaces/{namespace}/pods/{meta['name']}/eviction"
        answer = kubectl("create", "--raw", path, "-f", "-", input=json.dumps(eviction), check=False)
        return None if "Conflict" in answer.stderr else answer

    before = {}
    refused = eventually(evicted_or_refused, timeout=60, what="an eviction decided on the Ready pod")
    budget = kubectl.json("-n", namespace, "get", "pdb", "llama")
    seen = [(p["metadata"]["uid"], p["status"].get("phase")) for p in pods(kubectl, namespace)]
    after = f"{refused.stdout}{refused.stderr}; then budget {budget['metadata']['uid']} {budget['status']}; pods {seen}; before {before}"
    assert refused.returncode != 0 and "disruption budget" in refused.stderr, after


def test_a_drain_takes_one_replica_at_a_time(hollow_operator, kubectl, namespace, tmp_path):
    # one zone (two nodes): the drained node holds two replicas, and they can only move to the other
    zone = {LABEL: "true", "topology.kubernetes.io/zone": "zone-0"}
    apply(kubectl, namespace, replicas=4, gpusPerReplica=1, nodeSelector=zone)
    placed = eventually(
        lambda: len(serving(kubectl, namespace)) == 4 and serving(kubectl, namespace), timeout=90
    )
    eventually(
        lambda: (
            kubectl.json("-n", namespace, "get", "pdb", "llama")["status"].get("disruptionsAllowed", 0) >= 1
        ),
        timeout=30,
    )
    counts: dict[str, int] = {}
    for pod in placed:
        counts[pod["spec"]["nodeName"]] = counts.get(pod["spec"]["nodeName"], 0) + 1
    busiest = max(counts, key=counts.get)
    assert counts[busiest] == 2, counts
    watch = PodWatch(kubectl, namespace, tmp_path / "watch.json")
    listed = 4
    eventually(lambda: len(watch.events()) >= listed, timeout=30, what="the watch's initial listing")
    try:
        drain = subprocess.run(
            [
                str(kubectl.binary),
                f"--kubeconfig={kubectl.config}",
                "drain",
                busiest,
                "--delete-emptydir-data",
                "--ignore-daemonsets",
                "--timeout=150s",
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert drain.returncode == 0, drain.stderr
        eventually(
            lambda: len(serving(kubectl, namespace, avoid=busiest)) == 4,
            timeout=90,
            what="4 serving elsewhere",
        )
    finally:
        watch.stop()
        kubectl("uncordon", busiest)
    history = watch.counts()[listed:]  # from the first change on, past the initial listing
    assert history and min(ready for _, ready in history) >= 3, history


def test_a_dead_nodes_pods_are_replaced_on_the_others(hollow_operator, kubectl, namespace, hollow):
    apply(kubectl, namespace, replicas=4, gpusPerReplica=1, nodeFailureToleranceSeconds=10)
    placed = eventually(
        lambda: len(serving(kubectl, namespace)) == 4 and serving(kubectl, namespace), timeout=90
    )
    victim = placed[0]["spec"]["nodeName"]
    hollow.kill(victim)
    killed = time.monotonic()
    # the behaviour: 4 serving off the dead node while it is still dead; 180 s is the wait's bound, not a target
    eventually(
        lambda: len(serving(kubectl, namespace, avoid=victim)) == 4,
        timeout=180,
        interval=1,
        what="4 serving off the dead node",
    )
    elapsed = time.monotonic() - killed
    node = kubectl.json("get", "node", victim)
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] != "True"
    events = kubectl.json("-n", namespace, "get", "events", "--field-selector", "involvedObject.name=llama")
    assert any(e["reason"] == "NodeLost" for e in events["items"])
    print(f"4 of 4 serving off the dead node {elapsed:.0f} s after its kubelet was killed")
