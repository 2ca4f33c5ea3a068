"""bench/packing_throughput.py runs end to end at its smoke shape and reports both modes (no speed asserted)."""

from .bench_support import run_bench


def test_packing_bench_runs_and_reports_both_modes():
    proc = run_bench("packing_throughput.py", "--smoke")
    lines = [line.split() for line in proc.stdout.splitlines()]
    rows = {parts[0]: parts for parts in lines if parts and parts[0] in ("padded", "packed")}
    padded, packed = rows["padded"], rows["packed"]
    assert padded[3] == packed[3], "the same useful tokens both ways"
    assert int(packed[1]) < int(padded[1]), "packing needs fewer rows"
    assert float(padded[-1]) > 0 and float(packed[-1]) > 0
    assert "packed/padded useful tokens/s:" in proc.stdout
