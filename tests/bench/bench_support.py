"""A bench/ script run as docs/ says to: in a process of its own, with this checkout's src on its path."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def run_bench(script: str, *args: str) -> subprocess.CompletedProcess:
    """bench/<script> with ``args``, which must exit 0; its stdout and stderr as text."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc
