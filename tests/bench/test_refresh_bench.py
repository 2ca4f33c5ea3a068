"""bench/refresh.py runs end to end at its smoke shape: each refresh serves its new label (the bench checks
/model_info and a /generate against a fresh server's of the same weights), and it reports the time and memory
ratios (no speed asserted)."""

import re

from .bench_support import run_bench


def test_refresh_bench_runs_and_reports_the_ratios():
    proc = run_bench("refresh.py", "--smoke")
    lines = proc.stdout.splitlines()
    rows = [line.split() for line in lines if re.match(r"(refresh|restart) +[\d.]+ ", line)]
    refreshes, restarts = [r for r in rows if r[0] == "refresh"], [r for r in rows if r[0] == "restart"]
    assert len(refreshes) == len(restarts) == 2
    assert all(float(seconds) > 0 for _, seconds, *_ in refreshes + restarts)
    started = next(line.split(": ")[1] for line in lines if line.startswith("started as: "))
    assert started.startswith("sha256-")
    assert [row[-1] for row in refreshes] == ["weights-b-3", "weights-a-4"]  # after two sampled ones
    ratios = dict(line.split(": ") for line in lines if line.startswith(("refresh/", "refresh peak/")))
    assert float(ratios["refresh/restart time"]) > 0 and float(ratios["refresh/bare load time"]) > 0
    assert float(ratios["refresh peak/serving RSS"]) >= 1
