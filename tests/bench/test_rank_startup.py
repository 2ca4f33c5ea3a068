"""bench/rank_startup.py runs end to end at a small shape with two ranks, both ways (no speed asserted)."""

from .bench_support import run_bench


def test_rank_startup_bench_runs_and_reports_both_fetches():
    proc = run_bench("rank_startup.py", "--ranks", "2", "--vocab", "1024", "--hidden", "64")
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip().startswith("2 ")]
    assert [row[1] for row in rows] == ["once", "per"], proc.stdout
    # torchrun's and setup's seconds are never zero; a tiny embedding's fetch may round to 0.00
    assert all(float(row[-3]) > 0 and float(row[-2]) > 0 and float(row[-1]) >= 0 for row in rows), proc.stdout
