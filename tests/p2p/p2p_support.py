"""Helpers: a real `eagle3-target serve` process and real client processes, on loopback, time-bounded."""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from target_support import PORT_TAKEN, free_port

WORKER = Path(__file__).with_name("p2p_worker.py")
P2P_TIMEOUT = 10  # server-side rendezvous and transfer deadline


def port_range(size: int = 8) -> tuple[int, int]:
    """A base in a quiet part of the port space whose ports are all free now (other test runs on the machine
    use the same part); ports taken later by others are skipped by the server anyway."""
    while True:
        start = random.randrange(30000, 32000 - size)
        if all(_free(port) for port in range(start, start + size)):
            return start, start + size - 1


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class ServerProcess:
    def __init__(self, url: str, proc: subprocess.Popen, ports: tuple[int, int]):
        self.url, self.proc, self.ports = url, proc, ports

    def metric(self, name: str, **labels) -> float:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        pattern = rf"^{re.escape(name)}{re.escape('{' + want + '}') if want else ''} (\S+)$"
        found = re.search(pattern, text, re.M)
        return float(found.group(1)) if found else 0.0

    def wait_metric(self, name: str, value: float, timeout: float = 15.0, **labels) -> None:
        deadline = time.monotonic() + timeout
        while self.metric(name, **labels) != value:
            assert time.monotonic() < deadline, (
                f"{name}{labels} never reached {value} (is {self.metric(name, **labels)})"
            )
            time.sleep(0.05)

    def wait_metric_at_least(self, name: str, value: float, timeout: float = 60.0, **labels) -> None:
        deadline = time.monotonic() + timeout
        while self.metric(name, **labels) < value:
            assert time.monotonic() < deadline, f"{name}{labels} never reached {value}"
            time.sleep(0.05)


def start_server(*extra: str) -> ServerProcess:
    """`serve --engine synthetic` on a free port, ready; started again on another port if the one free_port()
    found was taken before the server could bind it."""
    for _ in range(5):
        started = _start_server(*extra)
        if started is not None:
            return started
    raise AssertionError("five ports in a row were taken before the server could bind one")


def _start_server(*extra: str) -> ServerProcess | None:
    port = free_port()
    ports = port_range()
    cmd = [
        sys.executable,
        "-m",
        "eagle3_target.cli",
        "serve",
        "--engine",
        "synthetic",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--nccl-port-range",
        f"{ports[0]}-{ports[1]}",
        "--p2p-timeout",
        str(P2P_TIMEOUT),
        *extra,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            err = proc.stderr.read().decode()
            assert PORT_TAKEN in err, err[-2000:]
            return None
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return ServerProcess(url, proc, ports)
        except OSError:  # refused, reset, or a slow answer while the model loads
            pass
        assert time.monotonic() < deadline, "server did not become ready"
        time.sleep(0.1)


def worker(mode: str, url: str, *args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, str(WORKER), mode, url, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kwargs,
    )


def result(proc: subprocess.Popen, timeout: float = 90.0) -> dict:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"worker timed out; stderr:\n{err[-3000:]}")
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def read_line(proc: subprocess.Popen, expected: str, timeout: float = 60.0) -> None:
    """Wait for ``expected`` on the worker's stdout (a reader thread keeps the wait bounded)."""
    import threading

    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not lines or lines[0].strip() != expected:
        proc.kill()
        pytest.fail(f"worker did not say {expected}: {lines}; stderr:\n{proc.stderr.read()[-3000:]}")
