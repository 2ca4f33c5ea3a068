"""Real promtool and Prometheus (Debian package `prometheus`) for the alert and dashboard tests.

Prometheus runs on 127.0.0.1 with a throwaway storage directory and scrapes real target servers on loopback,
labelled as the Prometheus Operator labels a target pod, so queries run over real samples.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import yaml
from chart.render import NAMESPACE, RELEASE
from target_support import free_port
from tiers import missing

# The pod a scraped server stands in for: replica 0 of the Eagle3Target the chart renders, labelled as the
# Prometheus Operator labels a target it discovers.
POD_LABELS = {
    "namespace": NAMESPACE,
    "pod": f"{RELEASE}-0",
    "container": "server",
    "service": f"{RELEASE}-peers",
}
INSTALL_HINT = "apt-get install prometheus, Debian's package; .ci/prometheus does it in CI"


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        missing(f"{name} is not on PATH", INSTALL_HINT)
    return path


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([binary("promtool"), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def write_rules(prometheus_rule: dict, path: Path) -> Path:
    """A PrometheusRule's spec is a Prometheus rule file: {groups: [...]}."""
    path.write_text(yaml.safe_dump({"groups": prometheus_rule["spec"]["groups"]}, sort_keys=False))
    return path


class Prometheus:
    """A running Prometheus and its HTTP API."""

    def __init__(self, url: str):
        self.url = url

    def api(self, path: str, **params: str) -> dict:
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query's result; raises on a parse or evaluation error (HTTP 400/422)."""
        try:
            return self.api("query", query=expr)["result"]
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{expr}: {exc.code} {exc.read().decode()}") from None

    def evaluated_rules(self, timeout: float = 60.0) -> list[dict]:
        """Every loaded rule, once each has been evaluated at least once."""
        deadline = time.monotonic() + timeout
        while True:
            rules = [r for g in self.api("rules")["groups"] for r in g["rules"]]
            if rules and all(r["health"] != "unknown" for r in rules):
                return rules
            assert time.monotonic() < deadline, f"rules not evaluated after {timeout}s: {rules}"
            time.sleep(0.5)

    def wait_for(self, expr: str, timeout: float = 90.0) -> list[dict]:
        """Poll until `expr` returns a sample (scrapes and rule evaluations happen every second)."""
        deadline = time.monotonic() + timeout
        while not (result := self.query(expr)):
            assert time.monotonic() < deadline, f"no result for {expr} after {timeout}s"
            time.sleep(0.5)
        return result


@contextlib.contextmanager
def running_prometheus(
    workdir: Path, targets: list[tuple[str, dict[str, str]]], rule_files: list[Path] = ()
) -> Iterator[Prometheus]:
    """Prometheus scraping each (host:port, labels) every second and evaluating `rule_files` every second."""
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": "eagle3-target",
                "honor_labels": True,  # as the chart's monitors: the server's own `endpoint` label wins
                "static_configs": [{"targets": [address], "labels": labels} for address, labels in targets],
            }
        ],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(workdir / "prometheus.log", "wb")  # noqa: SIM115 - closed below, after the process
    proc = subprocess.Popen(
        [
            binary("prometheus"),
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (workdir / "prometheus.log").read_text()
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{url}/-/ready", timeout=5) as response,
            ):
                if response.status == 200:
                    break
            assert time.monotonic() < deadline, "Prometheus did not get ready in 60 s"
            time.sleep(0.2)
        yield Prometheus(url)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
