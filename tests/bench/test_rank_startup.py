"""bench/rank_startup.py runs end to end at a small shape with two ranks, both ways (no speed asserted)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_rank_startup_bench_runs_and_reports_both_fetches():
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "rank_startup.py"),
            "--ranks",
            "2",
            "--vocab",
            "1024",
            "--hidden",
            "64",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip().startswith("2 ")]
    assert [row[1] for row in rows] == ["once", "per"], proc.stdout
    assert all(float(value) > 0 for row in rows for value in row[-3:])
