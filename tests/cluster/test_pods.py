"""Pods that really run: the chart's fleet on a real kubelet node, from the CI-built images.

One node and one `helm install` serve every test here (module scope): the node's start, the images' import and
the fleet's start are the slow part, and each test leaves the fleet as it found it (healed, REPLICAS Ready).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from client.client_support import assert_batch_matches, draft_vocab, expected, make_batch, wait_until
from cluster.cluster_dns import cluster_dns, wait_for_answer
from cluster.fleet import (
    HTTP_PORT,
    NAMESPACE,
    RELEASE,
    REPLICAS,
    SERVER_CONTAINER,
    TARGET,
    Kube,
    built_images,
    chart_values,
    ready,
    restarts,
    wait_for_fleet,
)
from cluster.node import GATEWAY, NODE_NAME, POD_SUBNET, TAINT, firewall_problems, start_node
from cluster.operator_process import eventually

from eagle3_target.client import PoolOptions, RemoteTargetBackend
from eagle3_target.server.runners.hf import HFRunner
from eagle3_target.server.runners.tiny import build_tiny_llama

pytestmark = pytest.mark.timeout(900)

CHART = str(Path(__file__).resolve().parents[2] / "charts" / "eagle3-target")
SERVICE = f"{TARGET}.{NAMESPACE}.svc.cluster.local"
OPTIONS = PoolOptions(
    resolve_interval=0.5,
    min_resolve_gap=0.2,
    request_timeout=20,
    deadline=240,  # a batch may wait out a whole fleet restart; it must not be dropped
    start_timeout=60,
    backoff_base=0.05,
    backoff_max=1.0,
    heartbeat_interval=1.0,
)
TIMES: dict[str, float] = {}  # what each stage took, printed at the end of the module (-s or the report)


def timed(stage: str, started: float) -> None:
    TIMES[stage] = round(time.monotonic() - started, 1)


@pytest.fixture(scope="session")  # session, as the control plane: checked before it starts
def images():
    return built_images()


@pytest.fixture(scope="module")
def kube(images, control_plane, kubectl, helm):
    return Kube(str(kubectl.binary), str(helm.binary), str(control_plane.admin_kubeconfig))


@pytest.fixture(scope="module")
def node(k8s_assets, control_plane, kube, images, tmp_path_factory):
    started = time.monotonic()
    node = start_node(k8s_assets, control_plane.run_dir, tmp_path_factory.mktemp("node"), kube.kubectl)
    try:
        assert firewall_problems() == [], "the node started without its firewall"
        TIMES["node start"] = round(node.start_seconds, 1)
        TIMES["image import"] = round(node.import_images(*images), 1)
        timed("node + images", started)
        yield node
    finally:
        node.stop()
        # gone for good, as a drained node: later tests' pods are not bound to it
        kube.run("kubectl", "delete", "node", NODE_NAME, "--wait=false", check=False)
        print(f"\ncluster-pods times (s): {TIMES}")


@pytest.fixture(scope="module")
def dns(control_plane, node):
    with cluster_dns(str(control_plane.admin_kubeconfig), GATEWAY) as served:
        yield served


@pytest.fixture(scope="module")
def weights_b(tmp_path_factory) -> Path:
    """Weights B of the embedded model's build, in a folder the pods mount (hostPath) at /models/b."""
    models = tmp_path_factory.mktemp("models")
    build_tiny_llama(seed=2).save_pretrained(models / "b")
    for path in (models, models / "b", *(models / "b").iterdir()):  # read by the server's non-root user
        path.chmod(0o755 if path.is_dir() else 0o644)
    return models / "b"


@pytest.fixture(scope="module")
def fleet(kube, node, dns, images, weights_b, tmp_path_factory):
    started = time.monotonic()
    values = chart_values(*images)
    host = {"hostPath": {"path": str(weights_b.parent), "type": "Directory"}}
    values["target"]["modelVolume"] = {"volumeSource": host, "mountPath": "/models"}
    kube.install(CHART, values, str(tmp_path_factory.mktemp("helm") / "values.yaml"))
    timed("helm install (operator Ready)", started)
    pods = wait_for_fleet(kube)
    timed("helm install -> fleet Ready", started)
    yield pods
    kube.run("helm", "uninstall", RELEASE, "-n", NAMESPACE, check=False)  # the node stop removes the pods


def test_node_is_the_bridge_and_the_firewall_holds_while_pods_run(kube, fleet):
    assert firewall_problems() == []
    [node] = kube.get("nodes")["items"]
    assert TAINT in node["spec"]["taints"]  # nothing of other tests lands here and pulls an image
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == GATEWAY  # never the machine's own eth0 address
    on_node = kube.get("pods", "-A", "--field-selector", f"spec.nodeName={NODE_NAME}")["items"]
    assert len(on_node) == REPLICAS + 1  # the targets and the operator
    for pod in on_node:
        assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(POD_SUBNET)


def test_endpoint_slices_list_the_ready_fleet(kube, fleet, dns):
    slices = kube.get("endpointslices", "-n", NAMESPACE, "-l", f"kubernetes.io/service-name={TARGET}")
    listed = {
        e["addresses"][0]
        for s in slices["items"]
        for e in s.get("endpoints") or ()
        if e["conditions"].get("ready")
    }
    assert listed == {p["status"]["podIP"] for p in fleet}
    _, nameserver = dns
    records = wait_for_answer(nameserver, SERVICE, "A", REPLICAS)
    assert {r.address for r in records} == listed
    srv = wait_for_answer(nameserver, f"_http._tcp.{SERVICE}", "SRV", REPLICAS)
    assert {r.port for r in srv} == {HTTP_PORT}
    by_name = {
        p["spec"]["hostname"]: p["status"]["podIP"] for p in fleet
    }  # <pod>.<name>-peers, as the chart's test
    for hostname, ip in by_name.items():
        [record] = wait_for_answer(
            nameserver, f"{hostname}.{TARGET}-peers.{NAMESPACE}.svc.cluster.local", "A", 1
        )
        assert record.address == ip


def test_helm_test_passes_against_the_running_fleet(kube, fleet):
    out = kube.run("helm", "test", RELEASE, "-n", NAMESPACE, "--logs", "--timeout", "3m", timeout=200)
    assert "Phase:          Succeeded" in out, out
    assert out.count("ok   http://") == REPLICAS + 1, out  # each replica by name, and the Service


def server_pid(node, pod_name: str) -> int:
    """The server process of a pod's container, as the host sees it."""
    container = node.crictl(
        "ps", "-q", "--name", SERVER_CONTAINER, "--label", f"io.kubernetes.pod.name={pod_name}"
    ).split()
    assert len(container) == 1, f"{pod_name}: running server containers {container}"
    return int(node.crictl("inspect", "-o", "go-template", "--template", "{{.info.pid}}", container[0]))


def disrupt(kube: Kube, node, fleet: list[dict], log: list[str]) -> None:
    """Delete one target pod, wait for the operator's replacement; then SIGKILL the other's server process,
    wait for the kubelet's restart. Each step leaves REPLICAS pods Ready."""
    first, second = fleet[0]["metadata"], fleet[1]["metadata"]
    kube.run("kubectl", "delete", "pod", first["name"], "-n", NAMESPACE, "--wait=false")
    started = time.monotonic()
    healed = wait_for_fleet(kube, avoid_uids=frozenset({first["uid"]}))
    timed("pod deleted -> replaced and Ready", started)
    log.append(f"replaced {first['name']}")
    before = restarts(next(p for p in healed if p["metadata"]["uid"] == second["uid"]))
    os.kill(server_pid(node, second["name"]), signal.SIGKILL)
    started = time.monotonic()
    wait_until(lambda: restarts(kube.get("pod", second["name"], "-n", NAMESPACE)) > before, timeout=120)
    wait_for_fleet(kube)
    timed("server killed -> restarted and Ready", started)
    log.append(f"restarted {second['name']}")


def test_client_trains_exact_batches_through_cluster_dns_while_the_fleet_heals(kube, node, fleet, dns):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the pods (OMP_NUM_THREADS=1): a bit-identical reference
    try:
        run_batches_through_disruptions(kube, node, fleet, dns)
    finally:
        torch.set_num_threads(threads)


def run_batches_through_disruptions(kube, node, fleet, dns) -> None:
    runner, vocab = HFRunner.load(), draft_vocab()
    _, nameserver = dns
    healed, log, failure = threading.Event(), [], []

    def disruptions() -> None:
        try:
            disrupt(kube, node, fleet, log)
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)
        finally:
            healed.set()

    submitted = []  # the seed of every batch handed to the client

    def inputs():  # batches flow until both disruptions are healed, then 10 more
        seed = 0
        while not healed.is_set():
            submitted.append(seed)
            yield make_batch(seed)
            seed += 1
        for tail in range(seed, seed + 10):
            submitted.append(tail)
            yield make_batch(tail)

    received, fewest_healthy = 0, REPLICAS
    with RemoteTargetBackend(
        f"dns://{SERVICE}:{HTTP_PORT}", nameserver=nameserver, options=OPTIONS
    ) as backend:
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        wait_until(lambda: backend.healthy_servers == REPLICAS, timeout=60)
        worker = threading.Thread(target=disruptions, name="disrupt", daemon=True)
        worker.start()
        for got in backend.prefetch(inputs(), depth=2):
            # in order, each equal to its own batch's reference: none lost, none duplicated, none mixed up
            batch = make_batch(received)
            assert_batch_matches(got, expected(runner, vocab, *batch), batch[1])
            received += 1
            fewest_healthy = min(fewest_healthy, backend.healthy_servers)
        worker.join(10)
        wait_until(lambda: backend.healthy_servers == REPLICAS, timeout=60)
    assert not failure, failure
    assert log == [f"replaced {fleet[0]['metadata']['name']}", f"restarted {fleet[1]['metadata']['name']}"]
    assert fewest_healthy < REPLICAS  # the client did lose a server on the way, and carried on
    # Batch i came back as the i-th result, so as many results as submissions is every batch, once.
    assert received == len(submitted) and submitted == list(range(received)), (received, len(submitted))
    assert received > 10
    assert all(ready(p) for p in kube.target_pods())
    TIMES["batches through the disruptions"] = received


def test_the_operator_pod_leads_with_its_service_account(kube, fleet):
    """In-cluster login: the pod's own token, the kubernetes Service's address mapped by the node."""
    pods = kube.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=operator")["items"]
    assert len(pods) == 1 and ready(pods[0])
    assert pods[0]["spec"]["serviceAccountName"] == f"{RELEASE}-eagle3-target-operator"
    lease = kube.get("lease", "eagle3-target-operator", "-n", NAMESPACE)
    assert lease["spec"]["holderIdentity"].startswith(pods[0]["metadata"]["name"])


def test_a_missing_secret_is_named_where_kubectl_get_shows_it(kube, fleet, tmp_path):
    """A real kubelet's FailedMount: a second target whose auth token Secret does not exist waits in
    ContainerCreating, and `kubectl get` says which Secret, with one Warning Event on the target."""
    spec = kube.get("eagle3target", TARGET, "-n", NAMESPACE)["spec"]
    spec.update(replicas=1, authTokenSecret={"name": "absent-token"}, disruption={"enabled": False})
    locked = {
        "apiVersion": "eagle3.dev/v1alpha1",
        "kind": "Eagle3Target",
        "metadata": {"name": "locked", "namespace": NAMESPACE},
        "spec": spec,
    }
    manifest = tmp_path / "locked.json"
    manifest.write_text(json.dumps(locked))
    kube.run("kubectl", "apply", "-f", str(manifest))
    try:
        columns = "custom-columns=READY:.status.conditions[?(@.type=='Ready')].reason,WAITING:.status.waiting"

        def named() -> str:
            shown = kube.run("kubectl", "get", "e3t", "locked", "-n", NAMESPACE, "-o", columns)
            return 'secret "absent-token" not found' in shown and shown

        shown = eventually(named, timeout=90, interval=1, what="the missing Secret in kubectl get")
        assert "FailedMount" in shown, shown
        default_columns = kube.run("kubectl", "get", "e3t", "locked", "-n", NAMESPACE)
        assert "absent-token" in default_columns, default_columns
        events = kube.get(
            "events", "-n", NAMESPACE, "--field-selector", "involvedObject.name=locked,type=Warning"
        )
        assert [e["reason"] for e in events["items"]].count("FailedMount") == 1, events["items"]
    finally:
        kube.run("kubectl", "delete", "-f", str(manifest), "--wait=true", "--timeout=60s", check=False)
    assert all(ready(p) for p in kube.target_pods())


def test_new_spec_weights_refresh_both_replicas_in_place_and_batches_name_them(kube, fleet, dns, weights_b):
    """spec.weights changed: the operator refreshes the two ready replicas in place (same pods, no container
    restart), status counts them, and a client pinned to the new version trains B's batches bit for bit."""
    before = {p["metadata"]["uid"]: restarts(p) for p in kube.target_pods()}
    weights = {"source": "/models/b", "version": "ft-2"}
    patch = json.dumps({"spec": {"weights": weights}})
    started = time.monotonic()
    kube.run("kubectl", "patch", "e3t", TARGET, "-n", NAMESPACE, "--type=merge", "-p", patch)

    def served() -> dict | bool:
        status = kube.get("e3t", TARGET, "-n", NAMESPACE).get("status", {})
        counted = status.get("targetVersion") == "ft-2" and status.get("targetVersionReplicas") == REPLICAS
        return counted and status

    status = eventually(served, timeout=180, interval=1, what="both replicas at ft-2 in the status")
    timed("spec.weights -> both replicas refreshed", started)
    assert status["readyReplicas"] == REPLICAS, status
    after = {p["metadata"]["uid"]: restarts(p) for p in kube.target_pods() if ready(p)}
    assert after == before, "a pod was replaced or its server restarted"
    shown = kube.run("kubectl", "get", "e3t", TARGET, "-n", NAMESPACE)
    assert "ft-2" in shown, shown
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the pods: a bit-identical reference
    try:
        runner, vocab = HFRunner.load(str(weights_b)), draft_vocab()
        _, nameserver = dns
        pinned = dataclasses.replace(OPTIONS, target_version="ft-2")
        with RemoteTargetBackend(
            f"dns://{SERVICE}:{HTTP_PORT}", nameserver=nameserver, options=pinned
        ) as backend:
            backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
            for seed, got in enumerate(backend.prefetch((make_batch(s) for s in range(6)), depth=2)):
                batch = make_batch(seed)
                assert_batch_matches(got, expected(runner, vocab, *batch), batch[1])
                assert got.target_version == "ft-2"
    finally:
        torch.set_num_threads(threads)
