"""bench/refresh_broadcast.py runs end to end at its smoke shape (and both refresh benches refuse a CUDA device
this torch lacks in one line): each broadcast serves its new label on both
replicas (the bench checks /model_info and /generate, and that weights A answer as at start-up), and it
reports the time and memory ratios (no speed asserted)."""

import os
import re
import subprocess
import sys

import pytest
import torch

from .bench_support import BENCH, ROOT, run_bench


def test_broadcast_bench_runs_and_reports_the_ratios():
    proc = run_bench("refresh_broadcast.py", "--smoke")
    lines = proc.stdout.splitlines()
    rows = [line.split() for line in lines if re.match(r"(raw|broadcast) +[\d.]+", line)]
    assert [row[0] for row in rows] == ["raw", "broadcast"] * 2
    assert all(float(row[1]) > 0 for row in rows)
    assert [row[-1] for row in rows if row[0] == "broadcast"] == ["weights-b-1", "weights-a-2"]
    ratios = dict(line.split(": ") for line in lines if line.startswith(("broadcast/", "after the last")))
    assert float(ratios["broadcast/raw time"]) > 0
    assert float(ratios["after the last broadcast/serving RSS"]) > 0
    assert any(line.startswith("checked: ") for line in lines)


@pytest.mark.parametrize("script", ["refresh.py", "refresh_broadcast.py"])
def test_a_cuda_device_this_torch_lacks_is_one_line_before_any_work(script):
    if torch.cuda.is_available():
        pytest.skip("this torch sees a CUDA device: the GPU run is the lent machine's")
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--device", "cuda:0", "--smoke"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 2 and not proc.stdout
    assert proc.stderr.splitlines()[-1].endswith(
        f"--device cuda:0: this torch ({torch.__version__}) sees no CUDA device"
    )
