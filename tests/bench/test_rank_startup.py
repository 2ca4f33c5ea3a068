"""bench/rank_startup.py runs end to end at a small shape with two ranks, both ways, for EAGLE-3 and for a
feature family (DSpark) (no speed asserted)."""

import pytest

from .bench_support import run_bench


@pytest.mark.parametrize("family", ["eagle3", "dspark"])
def test_rank_startup_bench_runs_and_reports_both_fetches(family):
    args = ("--family", family, "--ranks", "2", "--vocab", "1024", "--hidden", "64")
    proc = run_bench("rank_startup.py", *args)
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip().startswith("2 ")]
    assert [row[1] for row in rows] == ["once", "per"], proc.stdout
    # torchrun's and setup's seconds are never zero; a tiny embedding's fetch may round to 0.00
    assert all(float(row[-3]) > 0 and float(row[-2]) > 0 and float(row[-1]) >= 0 for row in rows), proc.stdout
