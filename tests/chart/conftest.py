"""Fixtures of the chart tests: real helm and kubectl binaries (see tests/tools.py), and a real Prometheus
scraping a real target server, with the chart's alert rules loaded."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import torch
from chart.prometheus_support import POD_LABELS, Prometheus, running_prometheus, write_rules
from chart.render import CI_VALUES, MONITORING_APIS, one, template
from target_support import free_port
from tools import Tools, install_tools

from eagle3_target.client import PoolOptions, RemoteTargetBackend
from eagle3_target.protocol import contract


@pytest.fixture(scope="session")
def tools() -> Tools:
    return install_tools()


@pytest.fixture(scope="session")
def monitoring_render(tools) -> list[dict]:
    return template(tools, api_versions=MONITORING_APIS, values_file=CI_VALUES["monitoring"])


def _serve_synthetic(port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "eagle3_target.cli", "serve", "--engine", "synthetic"]
    proc = subprocess.Popen([*cmd, "--host", "127.0.0.1", "--port", str(port)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, "the target server exited"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/{contract.HEALTH}", timeout=5) as response:
                if response.status == 200:
                    return proc
        except OSError:
            pass
        assert time.monotonic() < deadline, "the target server did not get ready in 120 s"
        time.sleep(0.2)


def _drive_traffic(url: str) -> None:
    """What a trainer does (vocab mapping, batches, heartbeats), plus one malformed request for the error panels."""
    options = PoolOptions(deadline=30.0, start_timeout=30.0, heartbeat_interval=0.5)
    with RemoteTargetBackend(url, options=options) as backend:
        mask = torch.zeros(512, dtype=torch.bool)
        mask[:96] = True
        backend.set_vocab_mapping(torch.arange(96), mask)
        for seed in range(4):
            ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(seed))
            backend.generate_batch(ids, torch.ones_like(ids), torch.ones_like(ids))
        time.sleep(1.5)  # a heartbeat or two
    bad = urllib.request.Request(f"{url}/{contract.GENERATE}", data=b"not a tensor archive", method="POST")
    try:
        urllib.request.urlopen(bad, timeout=10)
    except urllib.error.HTTPError as exc:
        assert 400 <= exc.code < 500, exc.code


@pytest.fixture(scope="session")
def live_prometheus(tmp_path_factory, monitoring_render) -> Iterator[Prometheus]:
    """Prometheus on loopback that has scraped a target server after a trainer's traffic, rules loaded."""
    workdir = tmp_path_factory.mktemp("prometheus")
    rules = write_rules(one(monitoring_render, "PrometheusRule"), workdir / "rules.yaml")
    port = free_port()
    server = _serve_synthetic(port)
    try:
        with running_prometheus(workdir, [(f"127.0.0.1:{port}", POD_LABELS)], [rules]) as prometheus:
            prometheus.wait_for("up == 1")
            _drive_traffic(f"http://127.0.0.1:{port}")
            # rate() over the traffic needs two scrapes that saw it.
            prometheus.wait_for('count_over_time(eagle3_target_requests_total{code=~"4.."}[1m]) >= 2')
            yield prometheus
    finally:
        server.terminate()
        server.wait(timeout=30)
