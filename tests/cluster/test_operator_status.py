"""What the operator reports from a real cluster: the real scheduler's Unschedulable message (this control plane
has no node) as Stalled, and a spec the CRD admits but the operator refuses as Degraded/InvalidSpec with exactly
one Warning Event in the events API, churning no pod."""

from __future__ import annotations

import json
import time

import pytest
import yaml
from cluster.operator_process import eventually, start_operator
from cluster.test_operator_identity import MANIFESTS, target

HOME = "eagle3-system"


def condition(kubectl, namespace: str, type_: str) -> dict:
    status = kubectl.json("-n", namespace, "get", "e3t", "llama").get("status", {})
    return next((c for c in status.get("conditions", []) if c["type"] == type_), {})


def warnings(kubectl, namespace: str, reason: str) -> list[dict]:
    events = kubectl.json("-n", namespace, "get", "events", f"--field-selector=reason={reason}")["items"]
    return [e for e in events if e["type"] == "Warning" and e["involvedObject"]["kind"] == "Eagle3Target"]


@pytest.fixture
def operator(crd, control_plane, kubectl, tmp_path):
    """The operator as a process with the manifests' identity, every namespace, a 1 s resync; no 403 allowed."""
    kubectl("apply", "-f", str(MANIFESTS / "namespace.yaml"), "-f", str(MANIFESTS / "rbac.yaml"))
    process = start_operator(
        control_plane,
        kubectl,
        tmp_path,
        "--all-namespaces",
        "--interval=1",
        namespace=HOME,
        service_account="eagle3-target-operator",
    )
    try:
        yield process
    finally:
        process.stop()
    assert "Forbidden" not in process.output()


def test_the_schedulers_refusal_and_an_invalid_spec_reach_the_status(operator, kubectl, namespace):
    spec = {"model": "m", "image": "example.test/server:1", "replicas": 1, "auxLayerIds": [3, 5, 7]}
    kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(target(namespace, **spec)))

    def stalled():
        cond = condition(kubectl, namespace, "Stalled")
        return cond.get("status") == "True" and cond.get("reason") == "Unschedulable" and cond

    cond = eventually(stalled, timeout=60, what="Stalled/Unschedulable")
    scheduled = kubectl.json("-n", namespace, "get", "pod", "llama-0")["status"]["conditions"]
    (refusal,) = [c["message"] for c in scheduled if c["type"] == "PodScheduled"]
    assert refusal in cond["message"]  # the scheduler's own words

    uid = kubectl.json("-n", namespace, "get", "pod", "llama-0")["metadata"]["uid"]
    patch = json.dumps({"spec": {"auxLayerIds": [3, 3, 7], "replicas": 2}})
    kubectl("-n", namespace, "patch", "e3t/llama", "--type=merge", "-p", patch)

    def invalid():
        cond = condition(kubectl, namespace, "Degraded")
        return cond.get("reason") == "InvalidSpec" and "duplicates" in cond["message"] and cond

    eventually(invalid, timeout=60, what="Degraded/InvalidSpec")
    eventually(lambda: warnings(kubectl, namespace, "InvalidSpec"), timeout=30, what="a Warning Event")
    time.sleep(3)  # several resyncs: no second Event, no pod touched
    (event,) = warnings(kubectl, namespace, "InvalidSpec")
    assert "duplicates" in event["message"] and event.get("count", 1) == 1
    pods = kubectl.json("-n", namespace, "get", "pods")["items"]
    assert [(p["metadata"]["name"], p["metadata"]["uid"]) for p in pods] == [("llama-0", uid)]


def container_status(kubectl, namespace: str, pod: str, state: dict, ready: bool = False) -> None:
    """What a kubelet writes through /status: the server container's state, the pod's conditions."""
    status = {
        "phase": "Running" if ready else "Pending",
        "podIP": "127.0.0.3",
        "podIPs": [{"ip": "127.0.0.3"}],
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": str(ready)},
            {"type": "ContainersReady", "status": str(ready)},
        ],
        "containerStatuses": [
            {
                "name": "server",
                "image": "example.test/server:1",
                "imageID": "",
                "ready": ready,
                "restartCount": 0 if "waiting" not in state else 3,
                "state": state,
            }
        ],
    }
    body = json.dumps({"status": status})
    kubectl("-n", namespace, "patch", "pod", pod, "--subresource=status", "--type=merge", "-p", body)


def test_a_progress_deadline_pull_and_crash_loops_stall_the_fleet(operator, kubectl, namespace):
    spec = {
        "model": "m",
        "image": "example.test/server:1",
        "replicas": 1,
        "progressDeadlineSeconds": 2,
        # no scheduler takes these pods: nothing but the deadline and the stand-in kubelet moves them
        "podTemplate": {"spec": {"schedulerName": "stand-in"}},
    }
    kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(target(namespace, **spec)))

    def stalled(reason: str):
        def check():
            cond = condition(kubectl, namespace, "Stalled")
            return cond.get("status") == "True" and cond.get("reason") == reason and cond

        return eventually(check, timeout=30, what=f"Stalled/{reason}")

    assert "no progress for 2 s" in stalled("ProgressDeadlineExceeded")["message"]
    pull = {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}
    container_status(kubectl, namespace, "llama-0", pull)
    assert "Back-off pulling image" in stalled("ImagePullBackOff")["message"]
    crash = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting"}}
    container_status(kubectl, namespace, "llama-0", crash)
    assert "back-off 40s restarting" in stalled("CrashLoopBackOff")["message"]
    container_status(kubectl, namespace, "llama-0", {"running": {}}, ready=True)
    eventually(
        lambda: (
            condition(kubectl, namespace, "Stalled").get("status") == "False"
            and condition(kubectl, namespace, "Ready").get("status") == "True"
        ),
        timeout=30,
        what="Ready, no longer Stalled",
    )
