"""Every example runs as its README says: the own-loop trainer against the embedded server it starts, and NeMo's
recipe through `eagle3-target train-draft` on the example's generated target and data."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from target_support import TargetProcess

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def run(args: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_own_trainer_learns_from_the_embedded_server_it_starts(tmp_path):
    done = run([str(EXAMPLES / "own_trainer.py"), "--steps", "40"], cwd=tmp_path)
    first, last = map(
        float, re.search(r"^KL ([\d.]+) -> ([\d.]+) over 40 steps$", done.stdout, re.M).groups()
    )
    assert last < first / 2, done.stdout


@pytest.mark.parametrize(
    ("make_data_args", "config", "run_dir", "done_line"),
    [
        ([], "recipe.yaml", "run", "Training complete"),
        # NeMo's DFlash loop logs its end on the root logger, quiet by default: its checkpoint is the proof.
        (["--architecture", "qwen3"], "dflash.yaml", "run-dflash", None),
    ],
    ids=["eagle3", "dflash"],
)
def test_nemo_recipe_trains_a_draft_on_the_generated_data(
    tmp_path, make_data_args, config, run_dir, done_line
):
    run([str(EXAMPLES / "nemo" / "make_data.py"), "--rows", "32", *make_data_args], cwd=tmp_path)
    server = TargetProcess("127.0.0.2", "--model", str(tmp_path / "target"))
    try:
        server.wait_ready()
        done = run(
            ["-m", "eagle3_target.cli", "train-draft", "--config", str(EXAMPLES / "nemo" / config)],
            cwd=tmp_path,
            EAGLE3_TARGET_SERVICE=server.url,
        )
    finally:
        server.kill()
    assert done_line is None or done_line in done.stdout + done.stderr
    assert list((tmp_path / run_dir / "checkpoints").glob("epoch_*_step_*/model/consolidated/*.safetensors"))
