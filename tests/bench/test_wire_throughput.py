"""bench/wire_throughput.py runs end to end at the small shape and prints every column it promises (no speed asserted)."""

from .bench_support import run_bench


def test_wire_bench_runs_and_reports_each_column():
    proc = run_bench("wire_throughput.py", "--shapes", "small", "--repeats", "2")
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.startswith("shape   MB/resp  raw TCP"))
    # The first table's row; the RSS table's follows.
    row = next(line for line in lines if line.startswith("small "))
    assert header.rstrip().endswith("server loop CPU ms/100 MB")
    name, mb, tcp, wire, ratio, *_, loop_cpu = row.split()
    assert name == "small" and mb == "23.1"
    assert float(tcp) > 0 and float(wire) > 0 and float(ratio) > 0
    assert float(loop_cpu) > 0  # the server's event loop did the sending
