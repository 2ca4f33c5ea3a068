"""The workflows: CI runs `.ci/run` on every pull request; the release workflow, on version tags, runs CI first,
then builds and pushes every image with the build script and the chart with helm; its version check really
refuses a wrong tag."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from images.support import VERSION
from tiers import missing
from tools import REPO

WORKFLOW = REPO / ".github" / "workflows" / "release.yaml"
CI_WORKFLOW = REPO / ".github" / "workflows" / "ci.yaml"


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def steps(workflow: dict, job: str) -> list[dict]:
    return workflow["jobs"][job]["steps"]


def test_runs_on_version_tags_only(workflow):
    # YAML 1.1 reads the key `on` as True
    assert workflow[True] == {"push": {"tags": ["v*"]}}
    assert workflow["permissions"] == {"contents": "read"}  # packages: write only where something is pushed
    pushing = {name for name, job in workflow["jobs"].items() if job.get("permissions", {}).get("packages")}
    assert pushing == {"images", "chart"}


def test_ci_runs_the_ci_script_on_pull_requests_and_main():
    ci = yaml.safe_load(CI_WORKFLOW.read_text())
    assert "pull_request" in ci[True] and ci[True]["push"] == {"branches": ["main"]}
    assert "workflow_call" in ci[True]
    assert [s["run"] for s in ci["jobs"]["ci"]["steps"] if s.get("name") == ".ci/run"] == ["bash .ci/run"]


def test_release_runs_ci_before_anything_is_built(workflow):
    assert workflow["jobs"]["ci"] == {"uses": "./.github/workflows/ci.yaml"}
    assert workflow["jobs"]["version"]["needs"] == "ci"


def test_builds_and_pushes_every_image_with_the_build_script(workflow):
    job = workflow["jobs"]["images"]
    assert job["needs"] == "version"
    assert job["strategy"]["matrix"]["image"] == ["server", "sglang", "trainer", "operator"]
    build = next(s for s in job["steps"] if "build-images.sh" in s.get("run", ""))
    assert build["env"]["PUSH"] == "1" and build["env"]["IMAGE"] == "${{ matrix.image }}"
    assert 'REGISTRY="ghcr.io/${GITHUB_REPOSITORY_OWNER,,}"' in build["run"]


def test_packages_and_pushes_the_chart_after_the_images(workflow):
    job = workflow["jobs"]["chart"]
    assert job["needs"] == "images"
    script = "\n".join(s.get("run", "") for s in job["steps"])
    assert "helm package charts/eagle3-target" in script
    assert 'helm push dist/eagle3-target-*.tgz "oci://ghcr.io/' in script


def test_secrets_reach_commands_only_through_the_environment(workflow):
    for job in workflow["jobs"].values():
        for step in job.get("steps", []):
            assert "${{" not in step.get("run", ""), step["run"]


@pytest.mark.parametrize(("tag", "ok"), [(f"v{VERSION}", True), ("v999.0.0", False), (VERSION, False)])
def test_version_check_refuses_a_tag_that_is_not_the_package_version(workflow, tag, ok):
    script = steps(workflow, "version")[1]["run"]
    result = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=REPO,
        env={**os.environ, "GITHUB_REF_NAME": tag},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode == 0) == ok, result.stdout + result.stderr
    if not ok:
        assert f"tag {tag}, pyproject.toml version {VERSION}, chart appVersion {VERSION}" in result.stdout


def test_zizmor_finds_nothing():
    """zizmor (the dev extra pins it; its wheel carries the binary, so nothing is downloaded at run time), offline,
    with the settings in .github/zizmor.yml."""
    zizmor = shutil.which("zizmor") or shutil.which("zizmor", path=str(Path(sys.executable).parent))
    if not zizmor:
        missing("zizmor is not installed", "pip install -e '.[dev]' installs it")
    result = subprocess.run(
        [zizmor, "--offline", "--no-progress", "."], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No findings to report" in result.stdout, result.stdout
