"""The fleet on the real node, installed the way the deploy walkthrough says: `helm install` of the chart with the
CI-built operator and server images (imported into containerd, `pullPolicy: Never`), the embedded tiny model on
CPU. The operator runs as a pod with the chart's ServiceAccount and RBAC and logs in in-cluster at the
kubernetes Service's address (KUBERNETES_SERVICE_HOST), which the node maps to the loopback API server.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass

import yaml
from cluster.node import TOLERATION
from tiers import missing

NAMESPACE = "fleet"
RELEASE = "e3t"
TARGET = "targets"
REPLICAS = 2
HTTP_PORT = 8001
SERVER_CONTAINER = "server"


def built_images() -> tuple[str, str]:
    """The server and operator images CI built (.ci/images), or one line saying how to get them."""
    server = os.environ.get("EAGLE3_TARGET_SERVER_IMAGE", "")
    operator = os.environ.get("EAGLE3_TARGET_OPERATOR_IMAGE", "")
    if not server or not operator:
        missing(
            "EAGLE3_TARGET_SERVER_IMAGE and EAGLE3_TARGET_OPERATOR_IMAGE are not both set",
            ".ci/images builds them with podman; export both as .ci/run does",
        )
    return server, operator


def _repository_and_tag(image: str) -> dict[str, str]:
    repository, _, tag = image.rpartition(":")
    return {"repository": repository, "tag": tag, "pullPolicy": "Never"}


def chart_values(server_image: str, operator_image: str) -> dict:
    """What a platform team sets for a CPU fleet of the embedded model; probes tightened for a test's patience."""
    fast = {"periodSeconds": 1, "timeoutSeconds": 5}
    return {
        # its own namespace only: the tier's other tests run operators and targets of their own
        "operator": {
            "image": _repository_and_tag(operator_image),
            "watchNamespaces": [NAMESPACE],
            "tolerations": [TOLERATION],
        },
        "target": {
            "name": TARGET,
            "model": "embedded-tiny-llama",
            "gpusPerReplica": 0,
            "replicas": REPLICAS,
            "image": _repository_and_tag(server_image),
            "modelCache": {"sizeLimit": "1Gi"},
            "tolerations": [TOLERATION],  # the helm test pod's too
            "probes": {
                "startup": {**fast, "failureThreshold": 120},
                "readiness": {**fast, "failureThreshold": 2},
                "liveness": {**fast, "failureThreshold": 5},
            },
            # one intra-op thread, as the test's reference forward: bit-identical supervision
            "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
        },
        # the check needs python3 only; the server image is the one already on the node
        "tests": {"image": server_image},
    }


@dataclass
class Kube:
    """kubectl and helm against one cluster, as a user runs them."""

    kubectl: str
    helm: str
    kubeconfig: str

    def run(self, tool: str, *args: str, timeout: float = 300, check: bool = True) -> str:
        binary = self.kubectl if tool == "kubectl" else self.helm
        done = subprocess.run(
            [binary, "--kubeconfig", self.kubeconfig, *args], capture_output=True, text=True, timeout=timeout
        )
        if check:
            assert done.returncode == 0, (
                f"{tool} {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
        return done.stdout

    def get(self, *args: str) -> dict:
        return json.loads(self.run("kubectl", "get", "-o", "json", *args))

    def target_pods(self) -> list[dict]:
        selector = f"eagle3.dev/target={TARGET},app.kubernetes.io/component=target"
        return self.get("pods", "-n", NAMESPACE, "-l", selector)["items"]

    def install(self, chart: str, values: dict, values_file: str) -> None:
        with open(values_file, "w") as f:
            yaml.safe_dump(values, f)
        self.run(
            "helm",
            "install",
            RELEASE,
            chart,
            "-n",
            NAMESPACE,
            "--create-namespace",
            "-f",
            values_file,
            "--wait",
            "--timeout",
            "5m",
            timeout=330,
        )


def ready(pod: dict) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def wait_for_fleet(kube: Kube, timeout: float = 300, avoid_uids: frozenset[str] = frozenset()) -> list[dict]:
    """Until REPLICAS target pods are Ready (none of them one of avoid_uids); those pods, by name."""
    deadline = time.monotonic() + timeout
    while True:
        pods = [p for p in kube.target_pods() if ready(p) and p["metadata"]["uid"] not in avoid_uids]
        if len(pods) == REPLICAS:
            return sorted(pods, key=lambda p: p["metadata"]["name"])
        if time.monotonic() > deadline:
            states = {p["metadata"]["name"]: p.get("status", {}).get("phase") for p in kube.target_pods()}
            raise TimeoutError(f"{len(pods)}/{REPLICAS} target pods Ready after {timeout} s: {states}")
        time.sleep(0.5)


def restarts(pod: dict) -> int:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return sum(s.get("restartCount", 0) for s in statuses if s["name"] == SERVER_CONTAINER)
