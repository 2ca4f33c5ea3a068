"""docs/engines.md: its table is the code's engine table, and its worked example, applied to a copy of the
project with nothing else, makes an engine that `serve --engine toy --device cpu` serves and that leaves
tests/operator and tests/server/test_cli.py passing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from engine_table import code_rows, docs_rows, example_files
from parallel_support import post
from target_support import TargetProcess, generate_body, vocab_body

from eagle3_target.protocol import wire
from eagle3_target.server.runners.hf import HFRunner

ROOT = Path(__file__).resolve().parents[2]
COPIED = ("src", "tests", "manifests", "charts", "docs", "examples", "README.md", "pyproject.toml")


def test_the_docs_table_is_the_engine_table():
    assert docs_rows() == code_rows()


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("project")
    ignore = shutil.ignore_patterns("__pycache__", ".pytest_cache")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=ignore)
        else:
            shutil.copy2(source, root / name)
    files = example_files()
    assert len(files) == 2
    for path, text in files.items():
        assert not (root / path).exists(), path
        (root / path).write_text(text)
    return root


def in_project(project: Path, *tests: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    return subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_example_engine_serves_and_the_operator_tests_pass(project, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(project / "src"))  # the server runs the copy's code
    server = TargetProcess("127.0.0.1", "--engine", "toy", "--device", "cpu").wait_ready(timeout=240)
    ids = torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(0))
    try:
        post(server.url, "set_vocab_mapping", vocab_body(torch.arange(10), torch.arange(512) < 10))
        reply = wire.decode(bytearray(post(server.url, "generate", generate_body(ids))))
    finally:
        server.kill()
    _, aux = HFRunner.load().forward(ids, torch.ones_like(ids))  # the same embedded tiny Llama, hf's hooks
    assert torch.equal(reply["aux_hidden_states"], aux)
    tests = in_project(project, "tests/operator", timeout=840)
    assert tests.returncode == 0, tests.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_serve_command_tests_pass_with_the_example_engine(project):
    """`serve`'s own tests, a real process each: minutes on a loaded machine."""
    tests = in_project(project, "tests/server/test_cli.py", timeout=2340)
    assert tests.returncode == 0, tests.stdout[-3000:]
