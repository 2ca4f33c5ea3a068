"""`eagle3-target probe` and `eagle3-target bench` against real servers."""

from __future__ import annotations

import json

import pytest

from eagle3_target.cli import main

pytestmark = pytest.mark.timeout(60)

SERVICE = "targets.team.svc.cluster.local"


def test_probe_lists_servers_found_through_dns(farm, dns_server, capsys):
    up = farm.start("127.0.0.2")
    port = int(up.rsplit(":", 1)[1])
    dns_server.set_a(SERVICE, ["127.0.0.2", "127.0.0.3"])  # nothing listens on 127.0.0.3
    code = main(["probe", f"dns://{SERVICE}:{port}", "--nameserver", dns_server.address, "--timeout", "2"])
    out = capsys.readouterr().out
    assert code == 1, out
    lines = out.splitlines()
    assert (
        lines[0].startswith(up) and "ready" in lines[0] and "rtt" in lines[0] and "hidden_size=64" in lines[0]
    )
    assert lines[1].startswith(f"http://127.0.0.3:{port}") and "down" in lines[1]
    assert lines[-1] == "1/2 servers ready"
    assert len(farm.server(up).sessions) == 0  # the probe ended its session


def test_probe_json_and_exit_code(farm, capsys, monkeypatch):
    urls = [farm.start("127.0.0.2"), farm.start("127.0.0.3")]
    monkeypatch.setenv("EAGLE3_TARGET_SERVICE", ",".join(urls))
    assert main(["probe", "--json", "--pings", "2"]) == 0
    reports = [json.loads(line) for line in capsys.readouterr().out.splitlines()[:2]]
    assert [r["url"] for r in reports] == urls
    assert all(r["ready"] and r["alive"] and r["rtt_ms"] > 0 for r in reports)
    assert reports[0]["model_info"]["aux_layer_ids"] == [1, 15, 28]


def test_probe_names_a_name_that_does_not_resolve(dns_server, capsys):
    code = main(["probe", f"dns://{SERVICE}", "--nameserver", dns_server.address, "--resolve-timeout", "0.3"])
    assert code == 2
    assert f"dns://{SERVICE}:8001 did not resolve" in capsys.readouterr().out


def test_bench_prints_throughput(farm, capsys):
    urls = [farm.start("127.0.0.2"), farm.start("127.0.0.3")]
    code = main(
        [
            "bench",
            ",".join(urls),
            "--batch-size",
            "2",
            "--seq-len",
            "64",
            "--batches",
            "6",
            "--draft-vocab",
            "100",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "2 servers" in out and "B=2 S=64 draft vocab 100" in out
    assert "batches/s" in out and "tokens/s" in out and "MB/s" in out and "(6 batches in" in out
