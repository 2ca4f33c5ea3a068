"""bench/refresh_broadcast.py runs end to end at its smoke shape: each broadcast serves its new label on both
replicas (the bench checks /model_info and /generate, and that weights A answer as at start-up), and it
reports the time and memory ratios (no speed asserted)."""

import re

from .bench_support import run_bench


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
