"""Every pod the project ships with a read-only root filesystem has a writable /tmp: Python's tempfile, torch's
import and the Hugging Face and Triton caches (HOME=/tmp in the images) need one, and without it a pod fails with
`No usable temporary directory found`. Checked on what is applied: every manifest, the chart rendered with each of
its value sets (test hooks included), and the target pods the operator builds from the chart's Eagle3Targets."""

from __future__ import annotations

import pytest
import yaml
from chart.render import CI_VALUES, template
from tools import REPO

from eagle3_target.operator import builders
from eagle3_target.operator.target_spec import TargetSpec

WORKLOADS = {"Job", "Deployment", "StatefulSet", "DaemonSet"}


def pod_specs(obj: dict) -> list[dict]:
    """The pod specs an object makes: a Pod's own, a workload's template, a CronJob's job template."""
    kind = obj.get("kind")
    if kind == "Pod":
        return [obj["spec"]]
    if kind in WORKLOADS:
        return [obj["spec"]["template"]["spec"]]
    if kind == "CronJob":
        return [obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]]
    if kind == "Eagle3Target":
        spec = TargetSpec.parse(obj["spec"])
        return [builders.pod_spec(spec, obj["metadata"]["name"], 0, "image")]
    return []


def unwritable_tmp(pod: dict) -> list[str]:
    """The containers with a read-only root and nothing writable mounted at /tmp."""
    writable = {v["name"] for v in pod.get("volumes", ()) if "emptyDir" in v or "persistentVolumeClaim" in v}
    bad = []
    for container in pod.get("initContainers", []) + pod["containers"]:
        if not (container.get("securityContext") or {}).get("readOnlyRootFilesystem"):
            continue
        mounts = container.get("volumeMounts", ())
        if not any(
            m["mountPath"] == "/tmp" and m["name"] in writable and not m.get("readOnly") for m in mounts
        ):
            bad.append(container["name"])
    return bad


def check(objects: list[dict]) -> dict[str, list[str]]:
    """Pod-making objects by kind/name, with the containers that lack a writable /tmp; asserts there are some."""
    found = {
        f"{o['kind']}/{o['metadata']['name']}": unwritable_tmp(pod)
        for o in objects
        if o
        for pod in pod_specs(o)
    }
    assert found, "nothing here makes a pod"
    return found


def test_every_manifest_gives_a_read_only_root_a_writable_tmp():
    objects = [
        o for m in sorted((REPO / "manifests").glob("*.yaml")) for o in yaml.safe_load_all(m.read_text())
    ]
    found = check(objects)
    assert {"Deployment/eagle3-target-operator", "Job/llama-draft", "Eagle3Target/llama"} <= set(found)
    assert {name: bad for name, bad in found.items() if bad} == {}


@pytest.mark.parametrize("values", sorted(CI_VALUES), ids=str)
def test_every_chart_pod_gives_a_read_only_root_a_writable_tmp(tools, values):
    found = check(template(tools, values_file=CI_VALUES[values]))
    assert {name: bad for name, bad in found.items() if bad} == {}


def test_the_check_sees_a_read_only_container_without_tmp():
    pod = {
        "containers": [{"name": "c", "securityContext": {"readOnlyRootFilesystem": True}}],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    assert unwritable_tmp(pod) == ["c"]
    pod["containers"][0]["volumeMounts"] = [{"name": "tmp", "mountPath": "/tmp"}]
    assert unwritable_tmp(pod) == []
