"""The operator as a real process with exactly the identity the manifests and the chart give it (a pod's
ServiceAccount token and files, its RBAC, no admin certificate), over a whole lifecycle: create, readiness,
scale up and down, a rolling update by image and by spec change, garbage collection. The audit log lists
every verb and resource it used: none may be refused (403), none may lack a grant, no grant may go unused.
An unchanged fleet costs no writes."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import yaml
from cluster.operator_process import StandInKubelet, eventually, start_operator

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
CHART = REPO / "charts" / "eagle3-target"
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
# Checked by the OwnerReferencesPermissionEnforcement admission plugin (children carry blockOwnerDeletion), which
# the test control plane enables: an authorization check, never a request of its own in the audit log.
ADMISSION_ONLY = {("eagle3.dev", "eagle3targets/finalizers", "update")}
# Used only by an in-place refresh for spec.weights (operator/refresh.py: the pod's served-version annotation, and
# the readiness gate a new pod passes once it serves them), which needs pods that serve: the stand-in kubelet runs
# no server, so this lifecycle never refreshes (tests/operator/test_weights*.py drive those calls).
REFRESH_ONLY = {("", "pods", "patch"), ("", "pods/status", "patch")}
LEGACY_FINALIZER = "eagle3.dev/kopf-finalizer"


def granted(documents: list[dict]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) every Role and ClusterRole among `documents` grants."""
    return {
        (group, resource, verb)
        for doc in documents
        if doc and doc["kind"] in ("Role", "ClusterRole")
        for rule in doc["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def used(events: list[dict]) -> set[tuple[str, str, str]]:
    def resource(ref: dict) -> str:
        return ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")

    return {(e["objectRef"].get("apiGroup", ""), resource(e["objectRef"]), e["verb"]) for e in events}


def refusals(events: list[dict]) -> list[str]:
    return [
        f"{e['verb']} {e['requestURI']}: {e['responseStatus'].get('message', '')}"
        for e in events
        if e["responseStatus"]["code"] == 403
    ]


def target(namespace: str, name: str = "llama", finalizers: list[str] | None = None, **spec) -> dict:
    meta = {"name": name, "namespace": namespace, **({"finalizers": finalizers} if finalizers else {})}
    return {"apiVersion": "eagle3.dev/v1alpha1", "kind": "Eagle3Target", "metadata": meta, "spec": spec}


def ready_condition(kubectl, namespace: str, name: str = "llama") -> dict:
    status = kubectl.json("-n", namespace, "get", "e3t", name).get("status", {})
    return next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})


def wait_rolled_out(kubelet: StandInKubelet, kubectl, namespace: str, replicas: int, image: str, port: int):
    """Keep making pods Ready until exactly `replicas` pods of `image` serve on `port` and the target says Ready."""

    def done():
        pods = [p for p in kubelet.step() if not p["metadata"].get("deletionTimestamp")]
        containers = [p["spec"]["containers"][0] for p in pods]
        return (
            len(pods) == replicas
            and all(c["image"] == image for c in containers)
            and all(any(port_["containerPort"] == port for port_ in c["ports"]) for c in containers)
            and ready_condition(kubectl, namespace).get("status") == "True"
            and kubectl.json("-n", namespace, "get", "e3t", "llama")["status"].get("readyReplicas")
            == replicas
        )

    eventually(done, timeout=90, interval=0.5, what=f"{replicas} ready pods of {image} on port {port}")


def writes_in(events: list[dict], namespace: str) -> list[str]:
    return [
        f"{e['verb']} {e['requestURI']}"
        for e in events
        if e["verb"] in WRITES and e["objectRef"].get("namespace") == namespace
    ]


def run_lifecycle(control_plane, kubectl, namespace: str, operator) -> None:
    kubelet = StandInKubelet(kubectl, namespace)
    spec = {"model": "m", "image": "example.test/server:1", "replicas": 2}
    # created with the finalizer earlier operator versions put on: the operator removes it (an upgrade)
    body = target(namespace, finalizers=[LEGACY_FINALIZER], **spec)
    kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(body))
    wait_rolled_out(kubelet, kubectl, namespace, 2, "example.test/server:1", 8001)
    stored = kubectl.json("-n", namespace, "get", "e3t", "llama")
    assert LEGACY_FINALIZER not in stored["metadata"].get("finalizers", [])
    status = stored["status"]
    assert status["selector"] == "eagle3.dev/target=llama,app.kubernetes.io/component=target"
    assert status["endpoints"] == ["127.0.0.2:8001", "127.0.0.3:8001"]
    assert status["observedGeneration"] == stored["metadata"]["generation"]
    pods = [f"pod/{p['metadata']['name']}" for p in kubelet.pods()]
    assert sorted(pods) == ["pod/llama-0", "pod/llama-1"]
    children = [
        "service/llama",
        "service/llama-peers",
        "configmap/llama-client",
        "poddisruptionbudget/llama",
        *pods,
    ]
    for child in children:
        owners = kubectl.json("-n", namespace, "get", child)["metadata"]["ownerReferences"]
        assert [(o["kind"], o["uid"], o["controller"], o["blockOwnerDeletion"]) for o in owners] == [
            ("Eagle3Target", stored["metadata"]["uid"], True, True)
        ], child
    first_uid = kubectl.json("-n", namespace, "get", "pod/llama-0")["metadata"]["uid"]

    # an unchanged fleet: several resyncs (--interval 1) later, not one write (the server's defaulting and
    # pruning of what the operator sent must still compare equal)
    before = writes_in(control_plane.audit_events(operator.user), namespace)
    time.sleep(5)
    assert writes_in(control_plane.audit_events(operator.user), namespace) == before

    kubectl("-n", namespace, "scale", "e3t/llama", "--replicas=3")
    wait_rolled_out(kubelet, kubectl, namespace, 3, "example.test/server:1", 8001)
    kubectl("-n", namespace, "scale", "e3t/llama", "--replicas=1")
    wait_rolled_out(kubelet, kubectl, namespace, 1, "example.test/server:1", 8001)
    # scaling rolls no pod, and scaling down removes the highest ordinals
    assert [(p["metadata"]["name"], p["metadata"]["uid"]) for p in kubelet.pods()] == [("llama-0", first_uid)]
    assert kubectl.json("-n", namespace, "get", "e3t/llama")["status"]["endpoints"] == ["127.0.0.2:8001"]
    kubectl("-n", namespace, "scale", "e3t/llama", "--replicas=2")
    wait_rolled_out(kubelet, kubectl, namespace, 2, "example.test/server:1", 8001)

    patch = {"spec": {"image": "example.test/server:2"}}
    kubectl("-n", namespace, "patch", "e3t/llama", "--type=merge", "-p", json.dumps(patch))
    wait_rolled_out(kubelet, kubectl, namespace, 2, "example.test/server:2", 8001)
    patch = {"spec": {"ports": {"http": 9000}}}
    kubectl("-n", namespace, "patch", "e3t/llama", "--type=merge", "-p", json.dumps(patch))
    wait_rolled_out(kubelet, kubectl, namespace, 2, "example.test/server:2", 9000)
    service_ports = kubectl.json("-n", namespace, "get", "service", "llama")["spec"]["ports"]
    assert [p["port"] for p in service_ports if p["name"] == "http"] == [9000]
    assert (
        ":9000"
        in kubectl.json("-n", namespace, "get", "configmap", "llama-client")["data"][
            "EAGLE3_TARGET_SERVICE_DNS"
        ]
    )

    check_disruption_budget(kubectl, namespace)
    check_mount_failure(kubectl, namespace)
    # no delete handler, no finalizer: the real garbage collector removes every child
    kubectl("-n", namespace, "delete", "e3t", "llama", "--wait=true", "--timeout=30s")

    def gone():
        kinds = "pods,services,configmaps,poddisruptionbudgets"
        left = kubectl("-n", namespace, "get", kinds, "-o", "name").stdout.split()
        return [n for n in left if n != "configmap/kube-root-ca.crt" and "openshift" not in n] == []

    eventually(gone, timeout=90, interval=1, what="the garbage collector removing the children")


def check_disruption_budget(kubectl, namespace: str) -> None:
    """The budget on by default, its bound switched (a patch that removes the other), then off (deleted)."""

    def budget() -> dict:
        return kubectl.json("-n", namespace, "get", "poddisruptionbudget", "llama")["spec"]

    assert budget()["maxUnavailable"] == 1 and budget()["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    patch = {"spec": {"disruption": {"minAvailable": 1}}}
    kubectl("-n", namespace, "patch", "e3t/llama", "--type=merge", "-p", json.dumps(patch))
    eventually(lambda: budget().get("minAvailable") == 1 and "maxUnavailable" not in budget(), timeout=30)
    patch = {"spec": {"disruption": {"enabled": False}}}
    kubectl("-n", namespace, "patch", "e3t/llama", "--type=merge", "-p", json.dumps(patch))
    eventually(
        lambda: not kubectl("-n", namespace, "get", "pdb", "-o", "name").stdout.strip(),
        timeout=30,
        what="the budget removed",
    )


def check_mount_failure(kubectl, namespace: str) -> None:
    """A pod stuck in ContainerCreating on a missing Secret: what the kubelet reports (written here as admin, as
    the stand-in kubelet does) reaches the target's status, named."""
    pod = kubectl.json("-n", namespace, "get", "pod", "llama-0")
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "llama-0.mount", "namespace": namespace},
        "involvedObject": {
            "kind": "Pod",
            "name": "llama-0",
            "namespace": namespace,
            "uid": pod["metadata"]["uid"],
        },
        "type": "Warning",
        "reason": "FailedMount",
        "message": 'MountVolume.SetUp failed for volume "auth-token" : secret "absent-token" not found',
        "source": {"component": "kubelet"},
    }
    kubectl("create", "-f", "-", input=json.dumps(event))
    if not pod["spec"].get("nodeName"):
        # bound, as a pod creating its containers is: the tier's scheduler would otherwise report it
        # Unschedulable over the status written below (a binding needs no Node object)
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "llama-0", "namespace": namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "stand-in"},
        }
        kubectl("create", "-f", "-", input=json.dumps(binding))
    container = pod["spec"]["containers"][0]
    status = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ],
        "containerStatuses": [
            {
                "name": container["name"],
                "image": container["image"],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": "ContainerCreating"}},
            }
        ],
    }
    kubectl(
        "-n",
        namespace,
        "patch",
        "pod",
        "llama-0",
        "--subresource=status",
        "-p",
        json.dumps({"status": status}),
    )

    def named():
        stored = kubectl.json("-n", namespace, "get", "e3t", "llama")["status"]
        return 'secret "absent-token" not found' in stored.get("waiting", "") and stored

    status = eventually(named, timeout=30, what="the missing Secret in status.waiting")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "FailedMount" and "absent-token" in ready["message"]


def assert_least_privilege(control_plane, operator, rbac: list[dict]) -> None:
    events = control_plane.audit_events(operator.user)
    assert refusals(events) == []
    assert "Forbidden" not in operator.output()
    calls, grants = used(events), granted(rbac)
    assert calls - grants == set(), "used without a grant"
    assert grants - calls - ADMISSION_ONLY - REFRESH_ONLY == set(), "granted without use"


def test_the_manifests_identity_runs_a_whole_lifecycle_with_least_privilege(
    crd, control_plane, kubectl, namespace, tmp_path
):
    """manifests/rbac.yaml, all namespaces; the Lease lands in the ServiceAccount's namespace, eagle3-system."""
    kubectl("apply", "-f", str(MANIFESTS / "namespace.yaml"), "-f", str(MANIFESTS / "rbac.yaml"))
    rbac = list(yaml.safe_load_all((MANIFESTS / "rbac.yaml").read_text()))
    operator = start_operator(
        control_plane,
        kubectl,
        tmp_path,
        "--all-namespaces",
        "--interval=1",
        namespace="eagle3-system",
        service_account="eagle3-target-operator",
    )
    try:
        # held by this operator: an earlier test's operator of the same identity leaves the Lease released
        eventually(
            lambda: kubectl.json("-n", "eagle3-system", "get", "lease", "eagle3-target-operator")["spec"].get(
                "holderIdentity"
            ),
            what="the operator's Lease in its own namespace, held",
        )
        run_lifecycle(control_plane, kubectl, namespace, operator)
    finally:
        operator.stop()
    assert operator.proc.returncode == 0, operator.output()[-3000:]
    # SIGTERM releases the Lease, so that a standby need not wait for it to expire
    released = kubectl.json("-n", "eagle3-system", "get", "lease", "eagle3-target-operator")["spec"]
    assert not released.get("holderIdentity")
    assert_least_privilege(control_plane, operator, rbac)


def test_the_charts_watch_namespaces_identity_runs_a_whole_lifecycle_with_least_privilege(
    crd, control_plane, kubectl, helm, namespace, tmp_path
):
    """The chart's RBAC with operator.watchNamespaces: namespaced Roles only where it watches."""
    home = f"{namespace}-op"
    kubectl("create", "namespace", home)
    # A release name of its own: the nodes ClusterRole is cluster-scoped and outlives the namespace, and a later
    # `helm install e3t` (tests/cluster/test_pods.py) refuses to adopt an object it did not create.
    release = f"id-{namespace[-5:]}"
    rendered = helm(
        "template",
        release,
        str(CHART),
        "--namespace",
        home,
        "--set",
        f"operator.watchNamespaces={{{namespace}}},target.enabled=false",
        "--show-only=templates/operator/serviceaccount.yaml",
        "--show-only=templates/operator/rbac.yaml",
    ).stdout
    rbac = [d for d in yaml.safe_load_all(rendered) if d]
    kubectl("apply", "-f", "-", input=rendered)  # every object names its namespace
    account = next(d for d in rbac if d["kind"] == "ServiceAccount")["metadata"]["name"]
    operator = start_operator(
        control_plane,
        kubectl,
        tmp_path,
        f"--namespace={namespace}",
        "--interval=1",
        namespace=home,
        service_account=account,
    )
    try:
        run_lifecycle(control_plane, kubectl, namespace, operator)
    finally:
        operator.stop()
        kubectl("delete", "namespace", home, "--wait=false")
        cluster_scoped = [d for d in rbac if d["kind"].startswith("Cluster")]
        kubectl("delete", *(f"{d['kind'].lower()}/{d['metadata']['name']}" for d in cluster_scoped))
    assert operator.proc.returncode == 0, operator.output()[-3000:]
    assert_least_privilege(control_plane, operator, rbac)


def test_the_finalizers_grant_is_what_lets_children_block_their_owners_deletion(
    crd, control_plane, kubectl, namespace, tmp_path
):
    """The one grant no request uses: OwnerReferencesPermissionEnforcement refuses a child with
    blockOwnerDeletion to whoever may not update the owner's finalizers."""
    kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(target(namespace, model="m")))
    uid = kubectl.json("-n", namespace, "get", "e3t", "llama")["metadata"]["uid"]
    kubectl("-n", namespace, "create", "serviceaccount", "writer")
    kubectl("-n", namespace, "create", "role", "writer", "--verb=create", "--resource=configmaps")
    kubectl(
        "-n",
        namespace,
        "create",
        "rolebinding",
        "writer",
        "--role=writer",
        f"--serviceaccount={namespace}:writer",
    )
    token = kubectl("-n", namespace, "create", "token", "writer").stdout.strip()
    writer = dataclasses.replace(kubectl, config=control_plane.write_kubeconfig(tmp_path / "w", token=token))
    owner = {
        "apiVersion": "eagle3.dev/v1alpha1",
        "kind": "Eagle3Target",
        "name": "llama",
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }

    def child(name: str) -> str:
        meta = {"name": name, "namespace": namespace, "ownerReferences": [owner]}
        return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta})

    refused = writer("create", "-f", "-", input=child("first"), check=False)
    assert refused.returncode != 0 and "cannot set blockOwnerDeletion" in refused.stderr, refused.stderr
    kubectl(
        "-n",
        namespace,
        "create",
        "role",
        "finalizers",
        "--verb=update",
        "--resource=eagle3targets.eagle3.dev/finalizers",
    )
    kubectl(
        "-n",
        namespace,
        "create",
        "rolebinding",
        "finalizers",
        "--role=finalizers",
        f"--serviceaccount={namespace}:writer",
    )
    # the authorizer sees the new binding within moments
    eventually(
        lambda: writer("create", "-f", "-", input=child("second"), check=False).returncode == 0, timeout=10
    )
