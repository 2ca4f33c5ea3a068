"""One version, pyproject.toml's: the chart's appVersion, every image the chart, the manifests and the operator
name by default, and the names the build script and the release workflow give the images all follow it."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
import yaml
from chart.render import CHART, one, template
from images.support import BUILD_SCRIPT, OPERATOR, SERVER, SGLANG, TRAINER, VERSION
from tools import REPO, install_tools

from eagle3_target.operator.config import package_default_image


@pytest.fixture(scope="module")
def tools():
    return install_tools()


def test_chart_app_version_is_the_package_version():
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"] == VERSION


def test_operator_default_image_is_the_server_image_of_this_version():
    assert package_default_image() == f"{SERVER}:{VERSION}"


def test_chart_defaults_name_this_version(tools):
    objects = template(tools, {})
    operator = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert operator["image"] == f"{OPERATOR}:{VERSION}"
    assert {"name": "EAGLE3_TARGET_IMAGE", "value": f"{SERVER}:{VERSION}"} in operator["env"]
    assert one(objects, "Eagle3Target")["spec"]["image"] == f"{SERVER}:{VERSION}"


def test_chart_selects_the_sglang_image_by_engine(tools):
    objects = template(tools, {"target.engine": '"sglang"'})
    assert one(objects, "Eagle3Target")["spec"]["image"] == f"{SGLANG}:{VERSION}"
    # the operator's default stays the hf image: other targets in the cluster may use the hf engine
    operator = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "EAGLE3_TARGET_IMAGE", "value": f"{SERVER}:{VERSION}"} in operator["env"]


def test_manifests_name_this_version():
    images = re.findall(
        r"(?:image|value): (ghcr\.io/\S+)",
        "".join(p.read_text() for p in (REPO / "manifests").glob("*.yaml")),
    )
    assert images, "the manifests name no image"
    assert {ref.rpartition(":")[2] for ref in images} == {VERSION}, images
    assert {ref.rpartition(":")[0] for ref in images} <= {SERVER, OPERATOR, SGLANG, TRAINER}, images


def test_the_trainer_job_runs_the_trainer_image_of_this_version():
    job = (REPO / "manifests" / "example-trainer-job.yaml").read_text()
    pod = next(d for d in yaml.safe_load_all(job) if d["kind"] == "Job")["spec"]["template"]["spec"]
    assert {c["image"] for c in pod["initContainers"] + pod["containers"]} == {f"{TRAINER}:{VERSION}"}


@pytest.fixture
def fake_tool(tmp_path):
    """A stand-in for docker: records each call's arguments, one line per call, and succeeds."""
    log = tmp_path / "calls"
    tool = tmp_path / "tool"
    tool.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    tool.chmod(0o755)
    return tool, log


def build_images(fake_tool, *args: str, **env: str) -> subprocess.CompletedProcess:
    inherited = {k: v for k, v in os.environ.items() if k not in ("TAG", "REGISTRY", "PUSH", "TORCH_VARIANT")}
    environ = {**inherited, "CONTAINER_TOOL": str(fake_tool[0]), **env}
    return subprocess.run(
        ["bash", str(BUILD_SCRIPT), *args], env=environ, capture_output=True, text=True, timeout=60
    )


def test_build_script_names_the_images_as_the_chart_does(fake_tool):
    result = build_images(fake_tool, "server", "operator", "sglang", "trainer", "trainer-cpu")
    assert result.returncode == 0, result.stderr
    refs = (SERVER, OPERATOR, SGLANG, TRAINER)
    built = [f"built {ref}:{VERSION}" for ref in refs] + [f"built {TRAINER}:{VERSION}-cpu"]
    assert result.stdout.splitlines() == built
    calls = fake_tool[1].read_text().splitlines()
    assert [c.split()[:3] for c in calls] == [
        ["build", "-f", "docker/server.Dockerfile"],
        ["build", "-f", "docker/operator.Dockerfile"],
        ["build", "-f", "docker/server-sglang.Dockerfile"],
        ["build", "-f", "docker/trainer.Dockerfile"],
        ["build", "-f", "docker/trainer.Dockerfile"],
    ]
    # the CPU trainer is the Dockerfile's cpu target; the CUDA trainer its last stage, the default
    assert "--target cpu" in calls[4] and "--target" not in "".join(calls[:4])
    # the server and CPU trainer images get the CPU torch unless told otherwise; no other image takes it
    cpu_torch = "--build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu"
    assert cpu_torch in calls[0] and cpu_torch in calls[4]
    assert "TORCH_INDEX_URL" not in "".join(calls[1:4])


def test_build_script_pushes_what_it_built(fake_tool):
    result = build_images(fake_tool, "operator", PUSH="1", REGISTRY="registry.example/team", TAG="rc1")
    assert result.returncode == 0, result.stderr
    calls = fake_tool[1].read_text().splitlines()
    assert calls[1] == "push registry.example/team/eagle3-target-operator:rc1"


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["nope"],
            {},
            "unknown image 'nope': expected server, operator, sglang, vllm, trainer or trainer-cpu",
        ),
        (["server"], {"TORCH_VARIANT": "cuda"}, "TORCH_VARIANT=cuda: expected cpu, cuNNN, rocmN.N or pip"),
    ],
)
def test_build_script_refuses_bad_input_before_building(fake_tool, args, env, message):
    result = build_images(fake_tool, *args, **env)
    assert result.returncode == 1 and result.stderr.strip() == f"build-images: {message}"
    assert not fake_tool[1].exists(), "the tool ran before the input was checked"
