"""The Kubernetes quickstarts run as written: every bash block of docs/deploy.md's EAGLE-3 quickstart and
docs/families.md's DFlash one (tests/quickstart_docs.py reads them), on a real single node, with only the
substitutions deploy.md's table names for a machine without GPUs or internet, to a checkpoint on the claim.

The cluster is a control plane of this module's own (no other test's pod can land on its untainted node) and
the shared start-node.sh node. What the docs leave to the reader's cluster comes from here: the images are
CI's (.ci/images), tagged with the names the docs use and imported into the node's containerd, never pulled
(every image the commands name is checked to be among them first); cluster DNS is tests/cluster/cluster_dns.py
on the node's gateway. The commands run in bash from the repository root, with kubectl on PATH and KUBECONFIG
set, as a user's shell has them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from cluster.cluster_dns import cluster_dns
from cluster.k8s import ControlPlane
from cluster.node import GATEWAY, firewall_problems, start_node
from quickstart_docs import cpu_commands
from tiers import missing
from tools import REPO, install_tools

pytestmark = pytest.mark.timeout(2400)

VERSION = "0.1.0"
REGISTRY = "ghcr.io/eagle3-target"
# What each CI image is called in the docs: the manifests' and the operator's defaults, the CPU trainer's tag.
DOC_NAMES = {
    "EAGLE3_TARGET_SERVER_IMAGE": f"{REGISTRY}/eagle3-target:{VERSION}",
    "EAGLE3_TARGET_OPERATOR_IMAGE": f"{REGISTRY}/eagle3-target-operator:{VERSION}",
    "EAGLE3_TARGET_TRAINER_IMAGE": f"{REGISTRY}/eagle3-target-trainer:{VERSION}-cpu",
}
STORAGE = Path("/srv/eagle3")  # the docs' hostPath volumes
TIMES: dict[str, float] = {}


def images_named(commands: list[str]) -> set[str]:
    named = set(re.findall(r"image: (\S+)", "\n".join(commands)))
    operator = (REPO / "manifests" / "operator.yaml").read_text()
    return (
        named
        | set(re.findall(r"image: (\S+)", operator))
        | set(re.findall(r'value: "?(ghcr\S+?)"?$', operator, re.M))
    )


@pytest.fixture(scope="module")
def images() -> list[str]:
    absent = [env for env in DOC_NAMES if not os.environ.get(env)]
    if absent:
        missing(
            f"{', '.join(absent)} not set",
            ".ci/images builds the images with podman; export them as .ci/run does",
        )
    for env, name in DOC_NAMES.items():
        subprocess.run(["podman", "tag", os.environ[env], name], check=True, capture_output=True)
    return list(DOC_NAMES.values())


@pytest.fixture(scope="module")
def cluster(k8s_assets, images, tmp_path_factory):
    """A fresh control plane, an untainted node holding the images, and DNS for cluster.local."""
    if STORAGE.exists():
        raise RuntimeError(f"{STORAGE} exists: another quickstart run holds it, or a run left it behind")
    plane = ControlPlane(k8s_assets, tmp_path_factory.mktemp("quickstart-plane"))
    plane.start()
    kubectl = install_tools().kubectl
    node = None
    try:
        started = time.monotonic()
        node = start_node(
            k8s_assets, plane.run_dir, tmp_path_factory.mktemp("node"), str(kubectl), taint=False
        )
        assert firewall_problems() == [], "the node started without its firewall"
        node.import_images(*images)
        TIMES["node + images"] = round(time.monotonic() - started, 1)
        with cluster_dns(str(plane.admin_kubeconfig), GATEWAY):
            yield plane
    finally:
        if node is not None:
            node.stop()
        plane.stop()
        shutil.rmtree(STORAGE, ignore_errors=True)
        print(f"\nquickstart times (s): {TIMES}")


def shell(plane: ControlPlane) -> dict[str, str]:
    tools = install_tools()
    return {
        **os.environ,
        "KUBECONFIG": str(plane.admin_kubeconfig),
        "PATH": f"{tools.kubectl.parent}:{os.environ['PATH']}",
    }


def run_quickstart(name: str, plane: ControlPlane, images: list[str]) -> list[str]:
    """Each block in bash -e, in order; the output of each."""
    commands = cpu_commands(name)
    unknown = images_named(commands) - set(images)
    assert not unknown, f"the {name} quickstart names images the node does not hold: {unknown}"
    outputs = []
    for i, command in enumerate(commands):
        started = time.monotonic()
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=REPO,
            env=shell(plane),
            capture_output=True,
            text=True,
            timeout=1800,
        )
        TIMES[f"{name} block {i + 1}"] = round(time.monotonic() - started, 1)
        if done.returncode != 0:
            diagnose(plane)
        assert done.returncode == 0, f"{name} block {i + 1} failed:\n{command}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    return outputs


def diagnose(plane: ControlPlane) -> None:
    """What the pods were doing when a block failed, on stdout (pytest shows it with the failure)."""
    kubectl = [str(install_tools().kubectl), f"--kubeconfig={plane.admin_kubeconfig}"]
    for args in (["get", "pods", "-A", "-o", "wide"], ["get", "events", "-A", "--sort-by=.lastTimestamp"]):
        print(subprocess.run([*kubectl, *args], capture_output=True, text=True).stdout[-4000:])


def checkpoint_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and p.stat().st_size > 0]


def test_the_eagle3_quickstart_trains_to_a_checkpoint(cluster, images):
    outputs = run_quickstart("eagle3", cluster, images)
    checkpoints = STORAGE / "draft-training" / "runs" / "llama-draft" / "checkpoints"
    assert re.search(r"epoch_\d+_step_\d+", outputs[-1]), outputs[-1]
    assert checkpoint_files(checkpoints), f"no checkpoint file under {checkpoints}"


def test_the_dflash_quickstart_trains_to_a_checkpoint(cluster, images):
    """After the EAGLE-3 one, on the same cluster: its step 1 re-applies the operator, a no-op."""
    outputs = run_quickstart("dflash", cluster, images)
    checkpoints = STORAGE / "dflash" / "draft-training" / "runs" / "qwen3-dflash" / "checkpoints"
    assert re.search(r"epoch_\d+_step_\d+", outputs[-1]), outputs[-1]
    assert checkpoint_files(checkpoints), f"no checkpoint file under {checkpoints}"
