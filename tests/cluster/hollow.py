"""Hollow nodes for the cluster tier: kubemark's hollow kubelets (real kubelet code, fake runtime and prober)
registered with the tier's control plane through the shared start-hollow-nodes.sh, whose header and the shared
README say why each setting is there. Pods on them become Running and Ready without running anything; nothing
may connect to their addresses (10.245.0.x, a port-less bridge the script makes and fences off)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cluster.k8s import Cli, ControlPlane
from cluster.node import shared_script
from tiers import missing

LABEL = "eagle3.dev/hollow"
ON_HOLLOW = {"nodeSelector": {LABEL: "true"}}  # a target spec's part that keeps its pods on hollow nodes


@dataclass
class HollowNodes:
    script: Path
    env: dict[str, str]
    directory: Path
    names: list[str]

    def run(self, *args: str, timeout: float = 240) -> str:
        result = subprocess.run(
            ["bash", str(self.script), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if result.returncode != 0:
            raise AssertionError(f"start-hollow-nodes.sh {' '.join(args)}: {result.stderr.strip()[-2000:]}")
        return result.stdout

    def kill(self, name: str) -> None:
        """A dead kubelet: SIGKILL by the PID the script recorded (its node stops reporting)."""
        pid_file = self.directory / "pids" / f"{name}.pid"
        os.kill(int(pid_file.read_text()), 9)
        pid_file.unlink()

    def stop(self) -> None:
        self.run("stop")


def start_hollow_nodes(
    control_plane: ControlPlane, kubectl: Cli, assets: Path, directory: Path, count: int, zones: int = 2
) -> HollowNodes:
    if os.geteuid() != 0:
        missing("hollow nodes need root (a bridge and an iptables chain)", "run the cluster tier as root")
    if not shutil.which("iptables"):
        missing("iptables is not installed", ".ci/node installs it (apt-get install -y iptables)")
    if not (assets / "kubemark").is_file():
        missing(f"no kubemark in KUBEBUILDER_ASSETS={assets}", "unpack shared/tools/k8s with unpack.sh")
    env = {
        **os.environ,
        "K8S_RUN_DIR": str(control_plane.run_dir),
        "K8S_BIN_DIR": str(assets),
        "HOLLOW_DIR": str(directory),
        "HOLLOW_ZONES": str(zones),
        "HOLLOW_GPUS": "8",
        "KUBECTL": str(kubectl.binary),
    }
    nodes = HollowNodes(shared_script("start-hollow-nodes.sh"), env, directory, [])
    try:
        nodes.run("start", str(count))
    except BaseException:
        nodes.stop()
        raise
    nodes.names = [f"hollow-{i}" for i in range(1, count + 1)]
    return nodes
