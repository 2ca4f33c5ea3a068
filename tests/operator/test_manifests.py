"""The CRD and the plain manifests: schema shape, examples valid against it, defaults agreeing with the
operator's, least-privilege RBAC, and an operator that imports no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from crd_support import default

from eagle3_target.operator import builders, discovery
from eagle3_target.operator.target_spec import TargetSpec

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


def load_all(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


@pytest.fixture(scope="module")
def crd() -> dict:
    return load_all("crd.yaml")[0]


@pytest.fixture(scope="module")
def schema(crd) -> dict:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def validator(schema: dict) -> jsonschema.Draft7Validator:
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def test_crd_identity_subresources_and_columns(crd):
    assert crd["metadata"]["name"] == "eagle3targets.eagle3.dev"
    assert crd["spec"]["scope"] == "Namespaced" and crd["spec"]["names"]["shortNames"] == ["e3t"]
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Ready",
        "Reason",
        "Desired",
        "ReadyReplicas",
        "Updated",
        "Waiting",
        "Version",
        "AtVersion",
        "Model",
        "Age",
    ]


def test_example_target_is_valid(schema):
    """Offline, against the schema; what the server refuses (bounds, enums, CEL rules) is tests/cluster's."""
    example = next(d for d in load_all("example-target.yaml") if d["kind"] == "Eagle3Target")
    validator(schema).validate(example)


def test_operator_status_validates_against_the_schema(schema):
    spec = TargetSpec.parse({"model": "m"})
    from eagle3_target.operator.planner import PodState, Rollout
    from eagle3_target.operator.status import Observed, compute_status

    pod = builders.pod(spec, "t", "ml", 0, "img")
    pod["status"] = {"podIP": "127.0.0.2", "conditions": [{"type": "Ready", "status": "True"}]}
    status = compute_status(
        name="t",
        pods=[PodState.from_pod(pod)],
        observed=Observed(Rollout(1, builders.revision(spec)), generation=1),
        image="img",
        selector=builders.selector_string("t"),
        previous=None,
    )
    validator(schema).validate({"spec": {"model": "m"}, "status": status})
    # a real API server prunes what the schema does not declare (kmock and jsonschema do not)
    declared = schema["properties"]["status"]["properties"]
    assert set(status) <= set(declared)
    condition_fields = declared["conditions"]["items"]["properties"]
    assert all(set(c) <= set(condition_fields) for c in status["conditions"])
    assert {"updatedReplicas", "revision", "image"} <= set(status)


def test_schema_defaults_equal_the_operators_defaults(schema):
    defaulted = default(schema["properties"]["spec"], {"model": "m"})
    assert TargetSpec.parse(defaulted) == TargetSpec.parse({"model": "m"})
    assert (
        defaulted["probes"]["startup"]["failureThreshold"] * defaulted["probes"]["startup"]["periodSeconds"]
        >= 1800
    )


def test_operator_deployment_is_single_recreate_with_liveness():
    deployment = next(d for d in load_all("operator.yaml") if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "http://0.0.0.0:8080/healthz" in container["args"]


def test_trainer_job_probes_then_trains_against_the_published_service():
    job = next(d for d in load_all("example-trainer-job.yaml") if d["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    probe, trainer = pod["initContainers"][0], pod["containers"][0]
    assert probe["command"] == ["eagle3-target", "probe", "$(EAGLE3_TARGET_SERVICE)"]
    assert trainer["command"][:2] == ["eagle3-target", "train-draft"]  # its recipe: tests/nemo
    target = next(d for d in load_all("example-target.yaml") if d["kind"] == "Eagle3Target")
    secret = pod["volumes"][0]["secret"]
    assert secret["secretName"] == target["spec"]["authTokenSecret"]["name"]
    for container in (probe, trainer):
        assert container["envFrom"] == [{"configMapRef": {"name": builders.client_configmap_name("llama")}}]
        token_env = {"name": "EAGLE3_TARGET_AUTH_TOKEN_FILE", "value": f"{builders.TOKEN_DIR}/token"}
        assert token_env in container["env"]


def test_operator_imports_no_torch():
    code = (
        "import sys\n"
        "import eagle3_target.cli, eagle3_target.operator.cli, eagle3_target.operator.handlers\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


KUBE_VERSION = "1.33.0"


@pytest.mark.parametrize("name", ["crd.yaml", "rbac.yaml", "operator.yaml", "example-trainer-job.yaml"])
def test_core_manifests_pass_kubernetes_validate(name):
    import kubernetes_validate

    for doc in load_all(name):
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_built_children_pass_kubernetes_validate():
    import kubernetes_validate

    example = next(d for d in load_all("example-target.yaml") if d["kind"] == "Eagle3Target")
    for extra in (
        {},
        {
            "hostNetwork": True,
            "affinity": {"nodeAffinity": {}},
            "env": [{"name": "X", "value": "1"}],
            "modelVolume": {"volumeSource": {"hostPath": {"path": "/m"}}},
            "serviceAccountName": "sa",
            "imagePullSecrets": [{"name": "reg"}],
        },
    ):
        spec = TargetSpec.parse({**example["spec"], **extra})
        for obj in [builders.pod(spec, "llama", "ml", 3, "img"), *discovery.children(spec, "llama", "ml")]:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_default_status_is_valid_and_reads_as_in_progress_to_kstatus(schema):
    """A new Eagle3Target is 'in progress' to helm --wait before the operator's first status write."""
    default = schema["properties"]["status"]["default"]
    validator(schema).validate({"spec": {"model": "m"}, "status": default})
    conditions = {c["type"]: c["status"] for c in default["conditions"]}
    assert conditions == {"Reconciling": "True", "Ready": "Unknown"}


def test_the_longest_admitted_name_fits_every_derived_name():
    name = "x" * builders.MAX_NAME_LENGTH
    spec = TargetSpec.parse({"model": "m", "replicas": 1024})
    assert len(builders.peers_service_name(name)) == 63
    assert len(builders.pod(spec, name, "ml", 1023, "img")["spec"]["hostname"]) <= 63
    for child in discovery.children(spec, name, "ml"):  # Service names are DNS labels, the rest subdomains
        assert len(child["metadata"]["name"]) <= (63 if child["kind"] == "Service" else 253), child["kind"]
    assert builders.name_problems(name) == [] and builders.name_problems(name + "x")


def test_operator_settings_come_from_flags_and_environment_at_startup(monkeypatch):
    import argparse
    from importlib import metadata

    from eagle3_target.operator import cli

    def parse(*argv: str):
        parser = argparse.ArgumentParser()
        cli.add_arguments(parser)
        return cli.config_from(parser.parse_args(argv))

    monkeypatch.delenv("EAGLE3_TARGET_IMAGE", raising=False)
    monkeypatch.delenv("EAGLE3_TARGET_OPERATOR_STUCK_POD_GRACE", raising=False)
    defaults = parse()
    assert defaults.image == f"ghcr.io/eagle3-target/eagle3-target:{metadata.version('eagle3-target')}"
    assert (defaults.stuck_pod_grace, defaults.leader_election, defaults.interval) == (300, True, 10)
    monkeypatch.setenv("EAGLE3_TARGET_OPERATOR_STUCK_POD_GRACE", "0")
    monkeypatch.setenv("EAGLE3_TARGET_IMAGE", "registry.test/x:1")
    configured = parse("--no-leader-election")
    monkeypatch.setenv("EAGLE3_TARGET_OPERATOR_STUCK_POD_GRACE", "soon")
    with pytest.raises(SystemExit):  # a usage error naming the value, not a traceback
        parse()
    assert (configured.stuck_pod_grace, configured.image, configured.leader_election) == (
        0,
        "registry.test/x:1",
        False,
    )
