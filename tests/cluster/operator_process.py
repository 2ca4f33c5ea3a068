"""`eagle3-target operator` as a real process with exactly a pod's identity: its ServiceAccount's token (minted
by `kubectl create token`), ca.crt and namespace files at /var/run/secrets/kubernetes.io/serviceaccount (in a
private mount namespace, so the host's /run is untouched), KUBERNETES_SERVICE_HOST/PORT pointing at the
loopback API server, and no kubeconfig at all. What it does to the cluster is in the audit log under
`system:serviceaccount:<namespace>:<name>`; what it prints is in its log file."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from cluster.k8s import Cli, ControlPlane
from tiers import missing

# In a new mount namespace: a tmpfs over /run (= /var/run) with the ServiceAccount files where a pod has them,
# and a resolv.conf naming only 127.0.0.1, so no name lookup can leave the machine; `exec` keeps the
# operator's PID the one Popen knows.
IN_POD = (
    "mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io"
    ' && cp -r "$0" /run/secrets/kubernetes.io/serviceaccount'
    ' && mount --bind "$0/../resolv.conf" /etc/resolv.conf && exec "$@"'
)


@dataclass
class OperatorProcess:
    proc: subprocess.Popen
    log: Path
    user: str

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@functools.cache
def _can_unshare() -> bool:
    probe = ["unshare", "--mount", "--propagation", "private", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except FileNotFoundError:
        return False


def start_operator(
    control_plane: ControlPlane,
    kubectl: Cli,
    workdir: Path,
    *args: str,
    namespace: str,
    service_account: str,
    name: str = "operator",
) -> OperatorProcess:
    """Start the operator in `namespace` as `service_account`; `args` follow `eagle3-target operator`."""
    if not _can_unshare():
        missing(
            "a private mount namespace for the operator's pod identity",
            "unshare --mount needs root, as CI has",
        )
    secrets = workdir / f"{name}-serviceaccount"
    secrets.mkdir(parents=True)
    token = kubectl("-n", namespace, "create", "token", service_account, "--duration=2h").stdout.strip()
    (secrets / "token").write_text(token)
    (secrets / "namespace").write_text(namespace)
    (secrets / "ca.crt").write_bytes(control_plane.ca.read_bytes())
    (workdir / "resolv.conf").write_text("nameserver 127.0.0.1\n")
    home = workdir / f"{name}-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env.update(
        HOME=str(home),  # no ~/.kube/config to fall back on
        KUBERNETES_SERVICE_HOST="127.0.0.1",
        KUBERNETES_SERVICE_PORT=str(control_plane.api_port),
        PYTHONUNBUFFERED="1",
    )
    command = [sys.executable, "-m", "eagle3_target.cli", "operator", "--liveness=", *args]
    log = workdir / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", IN_POD, str(secrets), *command],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    return OperatorProcess(proc, log, f"system:serviceaccount:{namespace}:{service_account}")


def eventually(check, timeout: float = 60, interval: float = 0.5, what: str = "condition"):
    """Poll `check` until it returns something truthy (returned) or raises nothing; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
        except AssertionError:
            result = None
            if time.monotonic() > deadline:
                raise
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout} s")
        time.sleep(interval)


class StandInKubelet:
    """Marks the operator's pods Running and Ready by patching their status as admin, the way envtest users
    do where no kubelet runs (cluster-pods' node fixture runs real ones); pod i gets IP 127.0.0.(i+2)."""

    def __init__(self, kubectl: Cli, namespace: str) -> None:
        self.kubectl, self.namespace = kubectl, namespace

    def pods(self) -> list[dict]:
        selector = "app.kubernetes.io/managed-by=eagle3-target-operator,app.kubernetes.io/component=target"
        return self.kubectl.json("-n", self.namespace, "get", "pods", "-l", selector)["items"]

    def step(self) -> list[dict]:
        """Make every pod that is not terminating Ready; returns the pods as they were listed."""
        pods = self.pods()
        for pod in pods:
            ready = any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in pod.get("status", {}).get("conditions", [])
            )
            if ready or pod["metadata"].get("deletionTimestamp"):
                continue
            ip = f"127.0.0.{int(pod['metadata']['labels']['eagle3.dev/ordinal']) + 2}"
            status = {
                "phase": "Running",
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "ContainersReady", "status": "True"},
                ],
            }
            patch = json.dumps({"status": status})
            name = pod["metadata"]["name"]
            # check=False: the pod may be gone meanwhile
            self.kubectl(
                "-n", self.namespace, "patch", "pod", name, "--subresource=status", "-p", patch, check=False
            )
        return pods
