"""bench/fair_share.py runs end to end, trainers in processes of their own, and prints what it promises
(no speed asserted: the goals are ratios read from a full run, recorded in docs/server.md)."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_fair_share_bench_runs_and_reports_each_trainer():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fair_share.py"), "--in-flight", "1,3", "--seconds", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert re.fullmatch(r"alone: max_in_flight 3: [0-9.]+ batches/s", lines[1])
    shared = [line for line in lines if line.startswith("shared:")]
    assert [line.split()[2] for line in shared] == ["1:", "3:"]
    assert all(re.search(r": [0-9.]+ batches/s, [0-9.]+x the mean$", line) for line in shared)
    assert re.match(
        r"# shares [0-9.]+\.\.[0-9.]+ of the mean .* total [0-9.]+ batches/s = [0-9.]+x", lines[-1]
    )
