"""bench/speculative_throughput.py runs end to end at its smoke shape, greedy and speculative giving the same
tokens (the bench asserts it), and reports the ratio (no speed asserted)."""

from .bench_support import run_bench


def test_speculative_bench_runs_and_reports_the_ratio():
    proc = run_bench("speculative_throughput.py", "--smoke")
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line.split()}
    assert rows["greedy"][2] == rows["speculative"][2], "the same output tokens both ways"
    assert float(rows["speculative"][4]) >= 1.0 and float(rows["greedy"][4]) == 1.0
    assert "speculative/greedy tokens/s:" in proc.stdout
