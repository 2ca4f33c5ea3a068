"""bench/packing_throughput.py runs end to end at its smoke shape and reports both modes (no speed asserted)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_packing_bench_runs_and_reports_both_modes():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "packing_throughput.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line.split() for line in proc.stdout.splitlines()]
    rows = {parts[0]: parts for parts in lines if parts and parts[0] in ("padded", "packed")}
    padded, packed = rows["padded"], rows["packed"]
    assert padded[3] == packed[3], "the same useful tokens both ways"
    assert int(packed[1]) < int(padded[1]), "packing needs fewer rows"
    assert float(padded[-1]) > 0 and float(packed[-1]) > 0
    assert "packed/padded useful tokens/s:" in proc.stdout
