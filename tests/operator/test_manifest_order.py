"""manifests/ applied in the README's order onto an empty cluster: every object's namespace and kind exist by
the time it arrives, as the API server requires. And the example trainer Job gets past the chart's
NetworkPolicy in a trainer image."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
# What an empty cluster has: its built-in namespaces and API groups.
BUILTIN_NAMESPACES = {"default", "kube-system", "kube-public", "kube-node-lease"}
BUILTIN_GROUPS = {"", "apps", "batch", "rbac.authorization.k8s.io", "apiextensions.k8s.io", "policy"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
NAMESPACED = {
    "ServiceAccount",
    "Deployment",
    "Job",
    "Secret",
    "Role",
    "RoleBinding",
    "ConfigMap",
    "Eagle3Target",
}


def documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def apply_to_empty_cluster(files: list[str]) -> list[str]:
    """The errors `kubectl apply` would print, file by file: a namespace not found, or no match for a kind."""
    namespaces, kinds, errors = set(BUILTIN_NAMESPACES), set(), []
    for name in files:
        for doc in documents(name):
            kind, group = doc["kind"], doc["apiVersion"].rpartition("/")[0]
            assert kind in CLUSTER_SCOPED | NAMESPACED, f"{name}: teach this test the scope of {kind}"
            what = f"{name}: {kind}/{doc['metadata']['name']}"
            if group not in BUILTIN_GROUPS and (group, kind) not in kinds:
                errors.append(f'{what}: no matches for kind "{kind}" in group "{group}"')
            namespace = doc["metadata"].get("namespace", "default")
            if kind in NAMESPACED and namespace not in namespaces:
                errors.append(f'{what}: namespaces "{namespace}" not found')
            if kind == "Namespace":
                namespaces.add(doc["metadata"]["name"])
            if kind == "CustomResourceDefinition":
                kinds.add((doc["spec"]["group"], doc["spec"]["names"]["kind"]))
    return errors


def readme_order() -> list[str]:
    section = (REPO / "README.md").read_text().split("## On Kubernetes", 1)[1].split("\n## ", 1)[0]
    return list(dict.fromkeys(re.findall(r"manifests/([a-z-]+\.yaml)", section)))


def operator_doc_order() -> list[str]:
    """Its first two blocks: the operator alone, then the examples."""
    section = (REPO / "docs" / "operator.md").read_text().split("## Running", 1)[1].split("\n## ", 1)[0]
    running = "\n".join(section.split("```")[1:4:2])
    return list(dict.fromkeys(re.findall(r"-f manifests/([a-z-]+\.yaml)", running)))


@pytest.mark.parametrize("order", [readme_order, operator_doc_order], ids=["README", "docs/operator.md"])
def test_documented_order_applies_to_an_empty_cluster(order):
    files = order()
    assert files[:4] == ["crd.yaml", "namespace.yaml", "rbac.yaml", "operator.yaml"], files
    assert "example-target.yaml" in files
    assert apply_to_empty_cluster(files) == []


def test_every_manifest_is_in_the_documented_order():
    assert set(operator_doc_order()) == {p.name for p in MANIFESTS.glob("*.yaml")}


def test_the_check_catches_objects_before_their_namespace_or_kind():
    errors = apply_to_empty_cluster(["rbac.yaml", "namespace.yaml", "example-target.yaml", "crd.yaml"])
    assert 'rbac.yaml: ServiceAccount/eagle3-target-operator: namespaces "eagle3-system" not found' in errors
    assert any('no matches for kind "Eagle3Target"' in e for e in errors)


def test_trainer_job_passes_the_network_policy_in_a_trainer_image():
    values = yaml.safe_load((REPO / "charts" / "eagle3-target" / "values.yaml").read_text())
    job = next(d for d in documents("example-trainer-job.yaml") if d["kind"] == "Job")
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert values["networkPolicy"]["trainerSelector"].items() <= labels.items()
    pod = job["spec"]["template"]["spec"]
    server_images = {values["target"]["image"]["repository"], values["operator"]["image"]["repository"]}
    server_images |= set(values["target"]["image"]["engineRepositories"].values())
    for container in pod["initContainers"] + pod["containers"]:
        assert container["image"].rpartition(":")[0] not in server_images
