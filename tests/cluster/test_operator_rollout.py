"""Healing and rollouts on a real API server: a deleted pod comes back with its ordinal and port block, a
surge rollout never has more than replicas + maxSurge pods nor fewer than replicas ready (seen by a watch on
every pod write), a partition holds the lower ordinals, and a new operator version restarts no pod. The stand-in
kubelet (operator_process.py) marks pods Ready; no node runs here."""

from __future__ import annotations

import json
import subprocess
import time

import yaml
from cluster.operator_process import StandInKubelet, eventually, start_operator
from cluster.test_operator_identity import MANIFESTS, ready_condition, target, wait_rolled_out

HOME = "eagle3-system"
SELECTOR = "app.kubernetes.io/managed-by=eagle3-target-operator,app.kubernetes.io/component=target"


def operator_for(control_plane, kubectl, tmp_path, *args: str, name: str = "operator"):
    kubectl("apply", "-f", str(MANIFESTS / "namespace.yaml"), "-f", str(MANIFESTS / "rbac.yaml"))
    return start_operator(
        control_plane,
        kubectl,
        tmp_path,
        "--all-namespaces",
        "--interval=1",
        *args,
        namespace=HOME,
        service_account="eagle3-target-operator",
        name=name,
    )


def apply(kubectl, namespace: str, **spec) -> None:
    kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(target(namespace, **spec)))


def patch_spec(kubectl, namespace: str, spec: dict) -> None:
    kubectl("-n", namespace, "patch", "e3t/llama", "--type=merge", "-p", json.dumps({"spec": spec}))


def uids(kubelet: StandInKubelet) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in kubelet.pods()}


def settled(kubelet: StandInKubelet, kubectl, namespace: str, replicas: int) -> None:
    """Make pods Ready until the target reports `replicas` ready and updated replicas of its generation."""

    def done():
        kubelet.step()
        stored = kubectl.json("-n", namespace, "get", "e3t", "llama")
        status = stored.get("status", {})
        return (
            status.get("observedGeneration") == stored["metadata"]["generation"]
            and status.get("readyReplicas") == status.get("updatedReplicas") == replicas
            and ready_condition(kubectl, namespace).get("status") == "True"
        )

    eventually(done, timeout=90, what=f"{replicas} ready, updated replicas")


class PodWatch:
    """`kubectl get pods --watch`: every pod write the API server makes, in order, as (pods, ready) counts."""

    def __init__(self, kubectl, namespace: str, path) -> None:
        self.path = path
        args = [
            "-n",
            namespace,
            "get",
            "pods",
            "-l",
            SELECTOR,
            "--watch",
            "--output-watch-events",
            "-o",
            "json",
        ]
        with open(path, "wb") as out:
            self.proc = subprocess.Popen(
                [str(kubectl.binary), f"--kubeconfig={kubectl.config}", *args], stdout=out
            )

    def events(self) -> list[dict]:
        text, decoder, events, at = self.path.read_text(), json.JSONDecoder(), [], 0
        while (at := _skip_space(text, at)) < len(text):
            try:
                event, at = decoder.raw_decode(text, at)
            except json.JSONDecodeError:  # the last event is still being written
                break
            events.append(event)
        return events

    def counts(self) -> list[tuple[int, int]]:
        pods: dict[str, dict] = {}
        history = []
        for event in self.events():
            pod = event["object"]
            if event["type"] == "DELETED":
                pods.pop(pod["metadata"]["name"], None)
            else:
                pods[pod["metadata"]["name"]] = pod
            ready = [p for p in pods.values() if _ready(p) and not p["metadata"].get("deletionTimestamp")]
            history.append((len(pods), len(ready)))
        return history

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _ready(pod: dict) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_a_deleted_pod_comes_back_with_its_ordinal_and_port_block(
    crd, control_plane, kubectl, namespace, tmp_path
):
    operator = operator_for(control_plane, kubectl, tmp_path)
    try:
        kubelet = StandInKubelet(kubectl, namespace)
        ports = {"http": 9000, "nccl": {"start": 30000, "end": 30015, "perReplica": 8}}
        apply(
            kubectl,
            namespace,
            model="m",
            image="example.test/server:1",
            replicas=2,
            hostNetwork=True,
            ports=ports,
        )
        settled(kubelet, kubectl, namespace, 2)
        before = {p["metadata"]["name"]: p for p in kubelet.pods()}
        kubectl("-n", namespace, "delete", "pod", "llama-1", "--wait=false")
        kubectl("-n", namespace, "delete", "service", "llama", "--wait=false")

        def healed():
            pod = kubectl.json("-n", namespace, "get", "pod", "llama-1")
            return pod["metadata"]["uid"] != before["llama-1"]["metadata"]["uid"] and pod

        pod = eventually(healed, timeout=30, what="llama-1 recreated")
        assert pod["metadata"]["labels"]["eagle3.dev/ordinal"] == "1"
        assert pod["spec"]["containers"][0]["ports"] == before["llama-1"]["spec"]["containers"][0]["ports"]
        assert {p["name"]: p["hostPort"] for p in pod["spec"]["containers"][0]["ports"]}["http"] == 9001
        eventually(lambda: kubectl.json("-n", namespace, "get", "service", "llama"), what="the Service back")

        def degraded_readiness():
            status = kubectl.json("-n", namespace, "get", "e3t", "llama")["status"]
            return status["readyReplicas"] == 1 and status["endpoints"] == ["127.0.0.2:9000"]

        eventually(degraded_readiness, timeout=30, what="readyReplicas 1")
        assert ready_condition(kubectl, namespace)["status"] == "False"
        settled(kubelet, kubectl, namespace, 2)
        status = kubectl.json("-n", namespace, "get", "e3t", "llama")["status"]
        assert status["endpoints"] == ["127.0.0.2:9000", "127.0.0.3:9001"]
        assert uids(kubelet)["llama-0"] == before["llama-0"]["metadata"]["uid"]
    finally:
        operator.stop()
    assert "Forbidden" not in operator.output()


def test_a_surge_rollout_keeps_every_replica_ready_and_one_extra_pod_at_most(
    crd, control_plane, kubectl, namespace, tmp_path
):
    operator = operator_for(control_plane, kubectl, tmp_path)
    watch = None
    try:
        kubelet = StandInKubelet(kubectl, namespace)
        strategy = {"maxSurge": 1, "maxUnavailable": 0}
        apply(
            kubectl, namespace, model="m", image="example.test/server:1", replicas=4, updateStrategy=strategy
        )
        settled(kubelet, kubectl, namespace, 4)
        old = set(uids(kubelet).values())
        watch = PodWatch(kubectl, namespace, tmp_path / "watch.json")
        eventually(lambda: len(watch.events()) == 4, timeout=30, what="the watch's initial list")
        patch_spec(kubectl, namespace, {"image": "example.test/server:2"})
        wait_rolled_out(kubelet, kubectl, namespace, 4, "example.test/server:2", 8001)
        time.sleep(1)  # the watch has seen the last writes
        history = watch.counts()[4:]
        assert history and max(total for total, _ in history) == 5, history  # it did surge
        assert all(total <= 5 and ready >= 4 for total, ready in history), history
        assert not old & set(uids(kubelet).values())
    finally:
        if watch:
            watch.stop()
        operator.stop()
    assert "Forbidden" not in operator.output()


def test_a_partition_updates_only_the_ordinals_at_or_above_it(
    crd, control_plane, kubectl, namespace, tmp_path
):
    operator = operator_for(control_plane, kubectl, tmp_path)
    try:
        kubelet = StandInKubelet(kubectl, namespace)
        strategy = {"partition": 2}
        apply(
            kubectl, namespace, model="m", image="example.test/server:1", replicas=3, updateStrategy=strategy
        )
        settled(kubelet, kubectl, namespace, 3)
        before = uids(kubelet)
        patch_spec(kubectl, namespace, {"dtype": "bfloat16"})

        def replaced():
            pod = kubectl.json("-n", namespace, "get", "pod", "llama-2")
            return pod["metadata"]["uid"] != before["llama-2"] and pod

        assert "bfloat16" in eventually(replaced, timeout=30)["spec"]["containers"][0]["args"]
        eventually(lambda: kubelet.step() and ready_condition(kubectl, namespace)["status"] == "True")
        time.sleep(3)  # three resyncs: the lower ordinals stay
        after = uids(kubelet)
        assert {n: after[n] for n in ("llama-0", "llama-1")} == {n: before[n] for n in ("llama-0", "llama-1")}
        assert kubectl.json("-n", namespace, "get", "e3t", "llama")["status"]["updatedReplicas"] == 1
    finally:
        operator.stop()
    assert "Forbidden" not in operator.output()


def test_an_operator_upgrade_restarts_nothing_and_a_spec_change_takes_the_new_default(
    crd, control_plane, kubectl, namespace, tmp_path
):
    old = operator_for(control_plane, kubectl, tmp_path, "--default-image=example.test/server:1", name="old")
    try:
        kubelet = StandInKubelet(kubectl, namespace)
        apply(kubectl, namespace, model="m", replicas=2)
        wait_rolled_out(kubelet, kubectl, namespace, 2, "example.test/server:1", 8001)
        before = uids(kubelet)
    finally:
        old.stop()
    new = operator_for(control_plane, kubectl, tmp_path, "--default-image=example.test/server:2", name="new")
    try:
        eventually(lambda: "acquired leadership" in new.output(), what="the new operator leading")
        not_ready = {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
        kubectl(
            "-n", namespace, "patch", "pod", "llama-1", "--subresource=status", "-p", json.dumps(not_ready)
        )
        eventually(
            lambda: kubectl.json("-n", namespace, "get", "e3t", "llama")["status"]["readyReplicas"] == 1,
            what="the new operator reacting",
        )
        kubelet.step()
        time.sleep(3)  # three resyncs
        assert uids(kubelet) == before
        assert (
            kubectl.json("-n", namespace, "get", "e3t", "llama")["status"]["image"] == "example.test/server:1"
        )
        patch_spec(kubectl, namespace, {"dtype": "bfloat16"})
        wait_rolled_out(kubelet, kubectl, namespace, 2, "example.test/server:2", 8001)
        assert (
            kubectl.json("-n", namespace, "get", "e3t", "llama")["status"]["image"] == "example.test/server:2"
        )
    finally:
        new.stop()
    assert "Forbidden" not in old.output() + new.output()


def test_a_pod_stuck_terminating_is_replaced_under_a_new_name_after_the_grace(
    crd, control_plane, kubectl, namespace, tmp_path
):
    operator = operator_for(control_plane, kubectl, tmp_path, "--stuck-pod-grace=3")
    try:
        kubelet = StandInKubelet(kubectl, namespace)
        apply(kubectl, namespace, model="m", image="example.test/server:1", replicas=2)
        settled(kubelet, kubectl, namespace, 2)
        # its node died: nobody confirms the deletion (a finalizer stands in for the absent kubelet)
        dead = json.dumps({"metadata": {"finalizers": ["test.eagle3.dev/dead-node"]}})
        kubectl("-n", namespace, "patch", "pod", "llama-1", "-p", dead)
        deleted = time.monotonic()
        kubectl("-n", namespace, "delete", "pod", "llama-1", "--wait=false")

        def replaced():
            names = sorted(uids(kubelet))
            return names == ["llama-0", "llama-1", "llama-1-r1"] and names

        eventually(replaced, timeout=30, interval=0.2, what="llama-1-r1")
        # not before the grace (less up to 1 s: deletionTimestamp has whole seconds)
        assert time.monotonic() - deleted >= 2
        new = kubectl.json("-n", namespace, "get", "pod", "llama-1-r1")
        assert new["metadata"]["labels"]["eagle3.dev/ordinal"] == "1"
        assert new["spec"]["hostname"] == "llama-1"  # the ordinal is the identity, the pod name is not
        assert kubectl.json("-n", namespace, "get", "pod", "llama-1")["metadata"]["deletionTimestamp"]
        settled(kubelet, kubectl, namespace, 2)
        patch_spec(kubectl, namespace, {"dtype": "bfloat16"})  # a rollout goes on past the stuck pod
        settled(kubelet, kubectl, namespace, 2)
        assert "llama-1" in uids(kubelet)  # still stuck, and in nobody's way
    finally:
        operator.stop()
        kubectl(
            "-n",
            namespace,
            "patch",
            "pod",
            "llama-1",
            "--type=merge",
            "-p",
            '{"metadata":{"finalizers":null}}',
        )
    assert "Forbidden" not in operator.output()
