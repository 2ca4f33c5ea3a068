"""Smoke tests of built images: .ci/images builds them with scripts/build-images.sh and names them in
EAGLE3_TARGET_SERVER_IMAGE and EAGLE3_TARGET_OPERATOR_IMAGE; without those the tests skip.

They run the images as a cluster would: the server as its non-root user with a read-only root filesystem and
no network at all (the embedded model needs no download), probed from inside its own container."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest
from tiers import missing

RUNTIME = os.environ.get("CONTAINER_RUNTIME") or shutil.which("podman") or shutil.which("docker") or "podman"
OPERATOR_MAX_BYTES = 400e6
SERVER_READY_S = 300  # loads torch and builds the embedded model on a loaded 2-core machine


def image(env: str) -> str:
    ref = os.environ.get(env)
    if not ref:
        missing(f"{env} is not set", "scripts/build-images.sh builds the image; .ci/run does it and sets it")
    return ref


def container(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([RUNTIME, *args], capture_output=True, text=True, timeout=timeout)


def inspect(ref: str) -> dict:
    result = container("image", "inspect", ref)
    assert result.returncode == 0, f"{ref} is not built: {result.stderr}"
    return json.loads(result.stdout)[0]


@pytest.fixture(scope="module")
def operator_image() -> str:
    return image("EAGLE3_TARGET_OPERATOR_IMAGE")


@pytest.fixture(scope="module")
def server_image() -> str:
    return image("EAGLE3_TARGET_SERVER_IMAGE")


def test_operator_help_exits_0(operator_image):
    result = container("run", "--rm", "--network", "none", operator_image, "--help")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--default-image" in result.stdout


def test_operator_image_has_no_torch(operator_image):
    probe = "import importlib.util; print(importlib.util.find_spec('torch') is None)"
    result = container(
        "run", "--rm", "--network", "none", "--entrypoint", "python", operator_image, "-c", probe
    )
    assert (result.returncode, result.stdout.strip()) == (0, "True"), result.stdout + result.stderr


def test_operator_image_is_small_and_not_root(operator_image):
    info = inspect(operator_image)
    assert info["Size"] < OPERATOR_MAX_BYTES, f"{operator_image} is {info['Size'] / 1e6:.0f} MB"
    assert info["Config"]["User"] == "1000:1000"


def test_images_carry_no_pip_cache_or_sources(operator_image, server_image):
    probe = "ls -d /root/.cache/pip /tmp/pip-* /src 2>/dev/null | wc -l"
    for ref in (operator_image, server_image):
        result = container("run", "--rm", "--network", "none", "--entrypoint", "sh", ref, "-c", probe)
        assert (result.returncode, result.stdout.strip()) == (0, "0"), (
            f"{ref}: {result.stdout}{result.stderr}"
        )


def http_from_inside(name: str, path: str, body: bytes | None = None) -> tuple[str, str]:
    """A request to the server on the container's own loopback (it has no other network), sent by the image's
    Python: (status code, body), or (the error's name, "") when nothing answers yet."""
    probe = (
        "import sys, urllib.request, urllib.error\n"
        "req = urllib.request.Request('http://127.0.0.1:8001' + sys.argv[1], data=sys.argv[2].encode() or None)\n"
        "try:\n"
        "    r = urllib.request.urlopen(req, timeout=10)\n"
        "    print(r.status, r.read().decode())\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code, e.read().decode())\n"
        "except OSError as e:\n"
        "    print(type(e).__name__, '')\n"
    )
    result = container("exec", name, "python", "-c", probe, path, (body or b"").decode())
    status, _, text = (result.stdout.strip() or result.stderr.strip()).partition(" ")
    return status, text


def test_server_serves_the_embedded_model_read_only_without_network(server_image):
    assert inspect(server_image)["Config"]["User"] == "1000:1000"
    name = f"eagle3-smoke-{os.getpid()}"
    # the operator's way: the image's entrypoint with `serve` arguments naming the embedded model
    serve = [
        "serve",
        "--model",
        "embedded-tiny-llama",
        "--device",
        "cpu",
        "--host",
        "0.0.0.0",
        "--port",
        "8001",
    ]
    started = container(
        "run",
        "-d",
        "--name",
        name,
        "--read-only",
        "--network",
        "none",
        "--tmpfs",
        "/tmp",
        server_image,
        *serve,
    )
    assert started.returncode == 0, started.stderr
    try:
        deadline, last = time.monotonic() + SERVER_READY_S, ""
        while time.monotonic() < deadline:
            running = container("inspect", "--format", "{{.State.Running}}", name).stdout.strip()
            assert running == "true", f"the server exited before /health answered 200:\n{logs(name)}"
            last, _ = http_from_inside(name, "/health")
            if last == "200":
                break
            time.sleep(2)
        assert last == "200", f"/health still says {last!r} after {SERVER_READY_S} s:\n{logs(name)}"
        uid = container("exec", name, "sh", "-c", "awk '/^Uid:/ {print $2}' /proc/1/status").stdout.strip()
        assert uid == "1000", f"the server runs as uid {uid!r}"
        status, info = http_from_inside(name, "/model_info", b"{}")
        assert status == "200" and json.loads(info)["model"] == "embedded-tiny-llama", info
    finally:
        container("rm", "-f", name)


def logs(name: str) -> str:
    result = container("logs", name)
    return (result.stdout + result.stderr)[-4000:]


@pytest.fixture(scope="module")
def trainer_image() -> str:
    return image("EAGLE3_TARGET_TRAINER_IMAGE")


def test_cpu_trainer_runs_read_only_and_refuses_a_missing_tmp_in_one_line(trainer_image):
    """The CPU trainer (`scripts/build-images.sh trainer-cpu`) as a pod runs it: uid 1000, read-only root. With
    /tmp a volume it answers; without one, `probe` says so in one line (the trainer Job's init step)."""
    assert inspect(trainer_image)["Config"]["User"] == "1000:1000"
    ok = container(
        "run",
        "--rm",
        "--network",
        "none",
        "--read-only",
        "--tmpfs",
        "/tmp",
        trainer_image,
        "train-draft",
        "--help",
    )
    assert ok.returncode == 0 and "--config" in ok.stdout, ok.stderr
    torch = "import torch; print(torch.cuda.is_available(), torch.version.cuda)"
    cpu = container("run", "--rm", "--network", "none", "--entrypoint", "python", trainer_image, "-c", torch)
    assert cpu.stdout.split() == ["False", "None"], cpu.stdout + cpu.stderr  # the CPU build of torch
    read_only = ["run", "--rm", "--network", "none", "--read-only", "--read-only-tmpfs=false"]
    refused = container(*read_only, trainer_image, "probe", "http://127.0.0.1:9")
    assert refused.returncode == 2
    assert refused.stderr.startswith("eagle3-target probe: error: no writable temporary directory")
    assert refused.stderr.count("\n") == 1
