"""docs/families.md's worked example, applied to a copy of the project: its three files and nothing else make a
family that an hf server answers, that trains through client.nemo against it, and that train-draft, the bench,
the docs table and the tests that enumerate the families all find."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .exactness import Family, make_target, recipe_yaml, saved_draft, start_fleet
from .family_table import example_files

ROOT = Path(__file__).resolve().parents[2]
COPIED = ("src", "tests", "bench", "docs", "examples", "pyproject.toml")
# The fast tests that enumerate the families: in the copy they must pass as they are.
ENUMERATING = (
    "tests/protocol/test_features.py",
    "tests/nemo/test_registry.py",
    "tests/nemo/test_families_config.py",
    "tests/bench/test_family_features.py::test_computed_reply_bytes_are_the_bytes_a_server_sends",
)
# two processes importing NeMo (about 30 s each on a loaded 2-core machine), a server, one short training
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
SMALL_DFLASH = dict(
    draft_num_hidden_layers=2, block_size=4, num_anchors=8, mask_token_id=3, attention_backend="sdpa"
)


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
    for path, text in example_files().items():
        assert not (root / path).exists(), path
        (root / path).write_text(text)
    return root


def in_project(project: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, *argv], cwd=project, env=env, capture_output=True, text=True, timeout=600
    )


def test_the_example_family_is_served_and_trains_and_train_draft_lists_it(project, tmp_path, monkeypatch):
    target = make_target(tmp_path / "qwen3", "qwen3")
    monkeypatch.setenv("PYTHONPATH", str(project / "src"))  # the server runs the copy's code too
    server = start_fleet(target.model, ["127.0.0.7"])[0]
    try:
        family = Family("TrainToyRecipe", "unused", SMALL_DFLASH)
        section = {"endpoints": server.url, "wait_timeout": 60}
        out = tmp_path / "run"
        path = recipe_yaml(
            family, target.config_only, target.chats, out, recipe="TrainToyRecipe", remote_target=section
        )
        trained = in_project(project, "-m", "eagle3_target.cli", "train-draft", "--config", str(path))
        assert trained.returncode == 0, trained.stderr[-3000:]
        assert saved_draft(out / "checkpoints")
        unknown = ["-m", "eagle3_target.cli", "train-draft", "--config", str(path), "--recipe=TrainNoSuch"]
        refused = in_project(project, *unknown)
    finally:
        server.kill()
    assert refused.returncode == 2 and "TrainToyRecipe" in refused.stderr.splitlines()[-1]


def test_the_bench_and_the_tests_that_enumerate_the_families_find_it_unchanged(project):
    script = (
        "import sys; sys.path.insert(0, 'bench'); import family_features as bench; "
        "print(sorted(bench.requests([1, 2, 3, 4, 5], 8))); print(sorted(bench.bytes_table()))"
    )
    bench = in_project(project, "-c", script)
    assert bench.returncode == 0, bench.stderr[-3000:]
    assert all("'toy'" in line for line in bench.stdout.splitlines()[-2:]), bench.stdout
    tests = in_project(project, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ENUMERATING)
    assert tests.returncode == 0, tests.stdout[-3000:]
