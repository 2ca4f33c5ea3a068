"""The Kubernetes quickstarts' text, which tests/cluster/test_quickstarts.py runs (tests/quickstart_docs.py reads
it): each is a complete sequence in the order a newcomer needs, every substitution deploy.md names is used and
is the only change between the commands on GPUs and those the tier runs, and no block applies the GPU example
target."""

from __future__ import annotations

import re

import jsonschema
import kubernetes_validate
import pytest
import yaml
from chart.render import KUBE_VERSION
from crd_support import admit, crd_schema, prune
from quickstart_docs import DOCS, blocks, cpu_commands, substitutions

from eagle3_target.operator.target_spec import TargetSpec

# What each step of a quickstart must contain, in order.
STEPS = {
    "eagle3": [
        "manifests/operator.yaml",
        "kubectl create namespace trainers",
        "kind: PersistentVolumeClaim",
        "create secret generic llama-target-token --from-literal=token=",
        "make_data.py",
        "kind: Eagle3Target",
        "kind: Job\nmetadata: {name: llama-draft}",
        "/srv/eagle3/draft-training/runs/llama-draft/checkpoints",
    ],
    "dflash": [
        "manifests/operator.yaml",
        "kubectl create namespace dflash",
        "create secret generic qwen3-target-token --from-literal=token=",
        "make_data.py --architecture qwen3",
        "kind: Eagle3Target",
        "kind: Job\nmetadata: {name: qwen3-dflash}",
        "/srv/eagle3/dflash/draft-training/runs/qwen3-dflash/checkpoints",
    ],
    "vispec": [
        "manifests/operator.yaml",
        "kubectl create namespace vispec",
        "create secret generic qwen25vl-target-token --from-literal=token=",
        "kind: Eagle3Target",
        "recipe: TrainVispecStage1Recipe",
        "kind: Job\nmetadata: {name: vispec-stage1}",
        "recipe: TrainVispecRecipe",
        "kind: Job\nmetadata: {name: vispec-stage2}",
        'draft_init_from="$(ls -d /data/runs/vispec-stage1/checkpoints/epoch_*_step_*',
    ],
}


@pytest.mark.parametrize("name", sorted(DOCS))
def test_the_quickstart_is_a_complete_sequence_in_order(name):
    text = "\n".join(cpu_commands(name))
    positions = [text.find(step) for step in STEPS[name]]
    assert -1 not in positions, [s for s, p in zip(STEPS[name], positions, strict=True) if p == -1]
    assert positions == sorted(positions)
    assert "example-target.yaml" not in text and "example-trainer-job.yaml" not in text
    assert all(b.language == "bash" for b in blocks(DOCS[name]))


def test_every_substitution_is_used_and_leaves_no_trace():
    gpu_text = "\n".join(b.text for path in DOCS.values() for b in blocks(path) if b.where != "without GPUs")
    cpu_text = "\n".join(c for name in DOCS for c in cpu_commands(name))
    for gpu, cpu in substitutions():
        assert gpu in gpu_text, f"{gpu!r} is in no quickstart block"
        assert gpu not in cpu_text or gpu in cpu, f"{gpu!r} is left in the commands the tier runs"
    assert len(substitutions()) >= 7


def objects(commands: list[str]) -> list[dict]:
    """The YAML documents of the commands' quoted heredocs."""
    docs = re.findall(r"<<'YAML'\n(.*?)^YAML$", "\n".join(commands), re.M | re.S)
    return [o for doc in docs for o in yaml.safe_load_all(doc) if o]


@pytest.mark.parametrize("name", sorted(DOCS))
def test_the_trainer_names_its_fleets_configmap_secret_and_recipe(name):
    found = objects(cpu_commands(name))
    target = next(o for o in found if o["kind"] == "Eagle3Target")["metadata"]["name"]
    job = next(o for o in found if o["kind"] == "Job" and "initContainers" in o["spec"]["template"]["spec"])
    pod = job["spec"]["template"]["spec"]
    config_maps = {
        c["configMapRef"]["name"] for c in pod["initContainers"] + pod["containers"] for c in c["envFrom"]
    }
    assert config_maps == {f"{target}-client"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    token = next(o for o in found if o["kind"] == "Eagle3Target")["spec"]["authTokenSecret"]["name"]
    assert volumes["auth-token"]["secret"]["secretName"] == token
    [trainer] = pod["containers"]
    assert not any(
        a.startswith("--checkpoint.") for a in trainer["command"]
    )  # the YAML's checkpoint_dir holds
    recipe = yaml.safe_load(next(o for o in found if o["kind"] == "ConfigMap")["data"]["recipe.yaml"])
    assert (
        volumes["recipe"]["configMap"]["name"]
        == next(o for o in found if o["kind"] == "ConfigMap")["metadata"]["name"]
    )
    assert recipe["checkpoint"]["checkpoint_dir"].startswith("/data/")


def test_the_substituted_images_are_the_cpu_builds():
    names = set(re.findall(r"image: (\S+)", "\n".join(cpu_commands("eagle3") + cpu_commands("dflash"))))
    assert names == {
        "ghcr.io/eagle3-target/eagle3-target:0.1.0",
        "ghcr.io/eagle3-target/eagle3-target-trainer:0.1.0-cpu",
    }


@pytest.mark.parametrize("name", sorted(DOCS))
def test_the_quickstarts_objects_match_the_crd_and_kubernetes_schemas(name):
    """Every object parses; the Eagle3Target has no field the CRD drops, validates against its schema and the
    operator finds no problem in it; the other objects are valid Kubernetes objects (strict: no unknown
    field)."""
    schema = crd_schema()
    found = objects([b.text for b in blocks(DOCS[name]) if b.quickstart == name])  # GPU blocks too
    assert {o["kind"] for o in found} >= {"Eagle3Target", "Job", "ConfigMap"}
    for obj in found:
        if obj["kind"] == "Eagle3Target":
            assert prune(schema["properties"]["spec"], obj["spec"]) == obj["spec"], "a field the CRD drops"
            jsonschema.Draft7Validator(schema).validate(obj)
            assert TargetSpec.parse(admit(schema, obj)["spec"]).problems() == []
        else:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    for config_map in (o for o in found if o["kind"] == "ConfigMap"):
        recipe = yaml.safe_load(config_map["data"]["recipe.yaml"])
        assert recipe.get("recipe", "TrainEagle3Recipe").startswith("Train") and "remote_target" in recipe
