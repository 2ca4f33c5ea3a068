"""The cluster tier: one real control plane per session (tests/cluster/k8s.py), a fresh namespace per test,
real kubectl and helm. Binaries are found the envtest way, in $KUBEBUILDER_ASSETS:
`export KUBEBUILDER_ASSETS=$(<shared>/tools/k8s/unpack.sh)`; without them the tier skips (fails in CI)."""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest
from cluster.hollow import LABEL, start_hollow_nodes
from cluster.k8s import Cli, ControlPlane
from tiers import missing
from tools import install_tools

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "manifests" / "crd.yaml"
CRD_NAME = "eagle3targets.eagle3.dev"
REQUIRED = ("etcd", "kube-apiserver")
HOLLOW_NODES = (
    4  # two zones of two, 8 GPUs each: enough to spread, drain, lose one, or fill with two groups of two
)
HOW = "export KUBEBUILDER_ASSETS=$(../shared/tools/k8s/unpack.sh), the envtest convention"


@pytest.fixture(scope="session")
def k8s_assets() -> Path:
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets:
        missing("Kubernetes binaries: KUBEBUILDER_ASSETS is not set", HOW)
    absent = [name for name in REQUIRED if not (Path(assets) / name).is_file()]
    if absent:
        missing(f"Kubernetes binaries: {', '.join(absent)} not in KUBEBUILDER_ASSETS={assets}", HOW)
    return Path(assets)


@pytest.fixture(scope="session")
def control_plane(k8s_assets, tmp_path_factory):
    plane = ControlPlane(k8s_assets, tmp_path_factory.mktemp("control-plane"))
    plane.start()
    yield plane
    plane.stop()


@pytest.fixture(scope="session")
def kubectl(control_plane, k8s_assets) -> Cli:
    """kubectl as cluster admin (the assets' kubectl if there is one, else the dev extra's)."""
    binary = k8s_assets / "kubectl"
    return Cli(binary if binary.is_file() else install_tools().kubectl, control_plane.admin_kubeconfig)


@pytest.fixture(scope="session")
def helm(control_plane) -> Cli:
    return Cli(install_tools().helm, control_plane.admin_kubeconfig)


@pytest.fixture
def namespace(kubectl, request) -> str:
    """A fresh namespace for this test, deleted afterwards (without waiting: the next test has its own). Its
    Eagle3Targets go first: a later test's operator watching all namespaces would otherwise try to heal them in
    a terminating namespace, which the server answers with 403."""
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{stem}-{uuid.uuid4().hex[:5]}"
    kubectl("create", "namespace", name)
    yield name
    # check=False: without the CRD (a test that never installed it) there is nothing to delete
    kubectl("-n", name, "delete", "eagle3targets", "--all", "--wait=true", "--timeout=60s", check=False)
    kubectl("delete", "namespace", name, "--wait=false")


@pytest.fixture(scope="session")
def crd(kubectl) -> dict:
    """The project's CRD, applied server-side as the README says, once per session and first (so that the
    garbage collector's discovery knows the kind before any test creates children of it)."""
    kubectl("apply", "--server-side", "-f", str(CRD_PATH))
    kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD_NAME}")
    return kubectl.json("get", "crd", CRD_NAME)


@pytest.fixture(scope="module")
def hollow(control_plane, kubectl, k8s_assets, tmp_path_factory):
    """HOLLOW_NODES hollow nodes for one test module (hollow.py), removed with their Node objects afterwards."""
    nodes = start_hollow_nodes(
        control_plane, kubectl, k8s_assets, tmp_path_factory.mktemp("hollow"), HOLLOW_NODES
    )
    yield nodes
    nodes.stop()
    kubectl("delete", "nodes", "-l", f"{LABEL}=true", "--wait=false", check=False)


@pytest.fixture
def hollow_operator(crd, control_plane, kubectl, hollow, tmp_path):
    """The operator as manifests/operator.yaml runs it (its ServiceAccount and RBAC), next to the hollow nodes;
    it must never have been refused by RBAC."""
    from cluster.test_operator_rollout import operator_for  # a test module: imported only where used

    process = operator_for(control_plane, kubectl, tmp_path)
    yield process
    process.stop()
    assert "Forbidden" not in process.output()
