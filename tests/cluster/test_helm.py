"""docs/deploy.md's install and upgrade, on a control plane of its own that starts empty (so Helm itself installs
the CRD from crds/): `helm install`, a CRD change applied server-side as the upgrade section says, then
`helm upgrade`, then `helm uninstall`, after which nothing of the release is left but the CRD, which Helm keeps
by design. No operator runs here (the operator tests do that), so `--wait` and `helm test`, which need
running target pods, belong to the node tier."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys

import pytest
import yaml
from cluster.k8s import ControlPlane
from cluster.operator_process import eventually
from cluster.test_operator_identity import CHART

from eagle3_target.exits import Exit

RELEASE, NAMESPACE = "eagle3-target", "trainers"
INSTALL = [
    "--set",
    "target.model=embedded-tiny-llama",
    "--set",
    "target.gpusPerReplica=0",
    "--set",
    "target.replicas=2",
]
# what every namespace has without anyone installing anything
BUILTIN = {"configmap/kube-root-ca.crt", "configmap/openshift-service-ca.crt", "serviceaccount/default"}


@pytest.fixture(scope="module")
def empty_cluster(k8s_assets, tmp_path_factory, kubectl, helm):
    plane = ControlPlane(k8s_assets, tmp_path_factory.mktemp("empty-cluster"))
    plane.start()
    yield (
        dataclasses.replace(kubectl, config=plane.admin_kubeconfig),
        dataclasses.replace(helm, config=plane.admin_kubeconfig),
    )
    plane.stop()


def listable(kubectl, namespaced: bool) -> str:
    names = kubectl("api-resources", "--verbs=list", f"--namespaced={str(namespaced).lower()}", "-o", "name")
    return ",".join(n for n in names.stdout.split() if n not in ("events", "events.events.k8s.io"))


def release_objects(kubectl) -> set[str]:
    """Every object of the release: in its namespace whatever the labels, elsewhere by the instance label."""
    inside = kubectl("-n", NAMESPACE, "get", listable(kubectl, True), "-o", "name").stdout.split()
    labelled = kubectl(
        "get", listable(kubectl, False), "-l", f"app.kubernetes.io/instance={RELEASE}", "-o", "name"
    ).stdout.split()
    return {n.replace(".apps/", "/") for n in inside + labelled} - BUILTIN


def test_install_upgrade_with_a_crd_change_and_uninstall_leave_nothing_behind(empty_cluster, tmp_path):
    kubectl, helm = empty_cluster
    # an operator started before its CRD exits (its Deployment restarts it) instead of idling unnoticed
    env = {**os.environ, "KUBECONFIG": str(kubectl.config), "HOME": str(tmp_path)}
    early = subprocess.run(
        [sys.executable, "-m", "eagle3_target.cli", "operator", "--liveness=", "--no-leader-election"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # one line and the CLI's exit code for failed work (docs/cli.md), not kopf's traceback
    assert early.returncode == Exit.FAILED and "Traceback" not in early.stderr, early.stderr
    assert early.stderr.splitlines()[-1] == (
        "eagle3-target operator: error: eagle3targets.eagle3.dev/v1alpha1 is not served: install the CRD first"
    )

    helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace", *INSTALL)
    kubectl("wait", "--for=condition=Established", "crd/eagle3targets.eagle3.dev", "--timeout=60s")
    installed = release_objects(kubectl)
    for expected in (
        "eagle3target.eagle3.dev/eagle3-target",
        "deployment/eagle3-target-operator",
        "serviceaccount/eagle3-target-operator",
        "clusterrole.rbac.authorization.k8s.io/eagle3-target-operator",
        "clusterrolebinding.rbac.authorization.k8s.io/eagle3-target-operator",
        "clusterrole.rbac.authorization.k8s.io/eagle3-target-operator-nodes",
        "role.rbac.authorization.k8s.io/eagle3-target-operator-leader-election",
    ):
        assert expected in installed, sorted(installed)
    assert kubectl.json("-n", NAMESPACE, "get", "e3t", RELEASE)["spec"]["replicas"] == 2

    # the next chart version changes the CRD: applied first, server-side, over the fields Helm wrote
    chart = tmp_path / "eagle3-target"
    shutil.copytree(CHART, chart)
    crd_file = chart / "crds" / "eagle3targets.yaml"
    crd = yaml.safe_load(crd_file.read_text())
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = "The next version's description."
    crd_file.write_text(yaml.safe_dump(crd))
    # without --force-conflicts: `conflict with "helm": .spec.versions`
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd_file))
    helm(
        "upgrade",
        RELEASE,
        str(chart),
        "-n",
        NAMESPACE,
        "--reuse-values",
        "--set",
        "podDisruptionBudget.minAvailable=1",
    )
    served = kubectl.json("get", "crd", "eagle3targets.eagle3.dev")["spec"]["versions"][0]
    assert served["schema"]["openAPIV3Schema"]["description"] == "The next version's description."
    upgraded = release_objects(kubectl)
    # the chart's budget values reach the target's spec; the operator owns the PodDisruptionBudget itself
    revision = f"secret/sh.helm.release.v1.{RELEASE}.v2"  # Helm's record of the new revision
    # the operator's own budget appears where its pod runs
    assert {revision} <= upgraded - installed <= {revision, "poddisruptionbudget.policy/eagle3-target"}
    disruption = kubectl.json("-n", NAMESPACE, "get", "e3t", RELEASE)["spec"]["disruption"]
    assert disruption == {"enabled": True, "minAvailable": 1}
    assert kubectl.json("-n", NAMESPACE, "get", "e3t", RELEASE)["spec"]["replicas"] == 2  # --reuse-values

    helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=120s")
    # the operator's pods go with their ReplicaSet, through the garbage collector
    eventually(lambda: release_objects(kubectl) == set(), timeout=90, interval=1, what="an empty release")
    assert kubectl("get", "crd", "eagle3targets.eagle3.dev", "-o", "name").stdout.strip()  # Helm keeps CRDs
