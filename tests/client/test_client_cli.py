"""`eagle3-target probe` and `eagle3-target bench` against real servers."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time

import pytest
from target_support import free_port

from eagle3_target.cli import main
from eagle3_target.server.options import ServerOptions

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
        lines[0].startswith(up)
        and " ready " in lines[0]
        and "rtt" in lines[0]
        and "hidden_size=64" in lines[0]
    )
    assert lines[1].startswith(f"http://127.0.0.3:{port}") and " down " in lines[1]
    assert lines[-1] == "1/2 servers ready"
    assert len(farm.server(up).service.sessions) == 0  # the probe ended its session


def test_probe_json_is_one_document_and_exit_code(farm, capsys, monkeypatch):
    urls = [farm.start("127.0.0.2"), farm.start("127.0.0.3")]
    monkeypatch.setenv("EAGLE3_TARGET_SERVICE", ",".join(urls))
    assert main(["probe", "--json", "--pings", "2"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [r["url"] for r in document["servers"]] == urls
    assert all(r["state"] == "ready" and r["rtt_ms"] > 0 for r in document["servers"])
    assert document["servers"][0]["model_info"]["aux_layer_ids"] == [1, 15, 28]
    assert (document["ready"], document["total"], document["exit_code"]) == (2, 2, 0)


def test_probe_json_stdout_stays_pure_with_debug_logs(farm):
    url = farm.start("127.0.0.2")
    proc = subprocess.run(
        [sys.executable, "-m", "eagle3_target.cli", "--log-level", "debug", "probe", url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": "always"},
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["servers"][0]["state"] == "ready"
    assert "DEBUG" in proc.stderr  # the logs went somewhere: stderr


def test_probe_reports_a_rejected_token_as_unauthorized(farm, tmp_path, capsys):
    url = farm.start("127.0.0.2", options=ServerOptions(auth_token="right"))
    wrong = tmp_path / "token"
    wrong.write_text("wrong\n")
    assert main(["probe", url, "--auth-token-file", str(wrong), "--json"]) == 3
    (report,) = json.loads(capsys.readouterr().out)["servers"]
    assert report["state"] == "unauthorized" and "HTTP 401" in report["error"]
    wrong.write_text("right\n")
    assert main(["probe", url, "--auth-token-file", str(wrong)]) == 0


def test_probe_says_why_a_dead_port_refused_in_words_and_takes_a_bare_host_and_port(capsys):
    port = free_port()
    assert main(["probe", f"127.0.0.1:{port}", "--json"]) == 4
    (report,) = json.loads(capsys.readouterr().out)["servers"]
    assert report["url"] == f"http://127.0.0.1:{port}"
    assert report["error"] == f"cannot connect to 127.0.0.1:{port}: Connection refused"  # no "ssl:default"


def test_probe_names_a_name_that_does_not_resolve(dns_server, capsys):
    code = main(["probe", f"dns://{SERVICE}", "--nameserver", dns_server.address, "--resolve-timeout", "0.3"])
    assert code == 4  # unreachable
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"dns://{SERVICE}:8001 did not resolve" in captured.err


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
            "--encoding",
            "hidden",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "2 servers" in out and "B=2 S=64 draft vocab 100, encoding hidden" in out
    assert "batches/s" in out and "tokens/s" in out and "(6 batches in" in out
    decoded, wire = (
        float(re.search(rf"{kind} ([\d.,]+) MB/s", out)[1].replace(",", "")) for kind in ("decoded", "wire")
    )
    share = int(re.search(r"\((\d+)% of decoded\)", out)[1])
    assert 0 < wire < decoded and share == pytest.approx(100 * wire / decoded, abs=1.5), out


def bench_process(*args: str, **popen) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "eagle3_target.cli", "bench", *args, "--seq-len", "16", "--batches", "4"]
    return subprocess.Popen(cmd, **popen)


def test_bench_fails_fast_naming_an_unreachable_endpoint():
    dead = f"http://127.0.0.2:{free_port('127.0.0.2')}"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "eagle3_target.cli", "bench", dead], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 4 and proc.stdout == ""  # unreachable
    assert f"no target server is reachable: {dead}" in proc.stderr and "down" in proc.stderr
    assert time.monotonic() - started < 45  # the start timeout (120 s) is never waited out


def test_bench_warns_when_fewer_servers_join_than_were_found(farm, capsys, caplog):
    up = farm.start("127.0.0.2")
    dead = f"http://127.0.0.3:{free_port('127.0.0.3')}"
    code = main(["bench", f"{up},{dead}", "--seq-len", "16", "--batches", "2", "--settle-timeout", "1"])
    assert code == 0
    assert "1 servers" in capsys.readouterr().out
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(m.startswith("unreachable, benchmarking without it: " + dead) for m in warnings), warnings
    assert any("only 1 of the 2 servers found joined" in m for m in warnings), warnings


def test_bench_refuses_an_empty_draft_vocab():
    proc = subprocess.run(
        [sys.executable, "-m", "eagle3_target.cli", "bench", "--draft-vocab", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--draft-vocab: must be at least 1, got 0" in proc.stderr


def test_bench_shows_progress_on_a_terminal(farm):
    url = farm.start("127.0.0.2")
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a 120-column terminal
    proc = bench_process(url, stdout=subprocess.PIPE, stderr=terminal)
    os.close(terminal)
    assert proc.wait(timeout=60) == 0
    shown = b""
    with contextlib.suppress(OSError):  # EIO once the terminal's last writer has gone
        while chunk := os.read(controller, 65536):
            shown += chunk
    os.close(controller)
    # warm-up (3) and timed batches (4) on bars of their own, on stderr
    assert b"warm-up: 100%" in shown and b"3/3" in shown and b"batches: 100%" in shown and b"4/4" in shown
    assert b"batch/s" not in proc.stdout.read()


def test_bench_logs_progress_lines_without_a_terminal(farm):
    url = farm.start("127.0.0.2")
    proc = bench_process(url, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "INFO eagle3_target.client.bench: warm-up: 3/3 batches" in err
    assert "INFO eagle3_target.client.bench: batches: 4/4 batches" in err
    assert "batches/s" in out and "\r" not in err
