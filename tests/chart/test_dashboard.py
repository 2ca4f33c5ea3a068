"""The Grafana dashboard queries only metrics a running target server exports, and covers what the issue lists."""

from __future__ import annotations

import json
import re

import pytest
from chart.prometheus_support import POD_LABELS
from chart.render import CHART
from prometheus_client.parser import text_string_to_metric_families
from target_support import serve

from eagle3_target.protocol import contract
from eagle3_target.server.metrics import GENERATE_PHASES
from eagle3_target.server.runners.synthetic import SyntheticRunner

DASHBOARD = json.loads((CHART / "dashboards" / "eagle3-target.json").read_text())
# Labels Prometheus (and the Prometheus Operator's monitors) attach to every scraped series.
TARGET_LABELS = {"namespace", "pod", "service", "job", "instance", "container"}
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
METRIC_NAME = re.compile(r"\beagle3_target_[a-zA-Z0-9_]+")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def expressions(dashboard: dict) -> list[str]:
    found = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found.append(variable["query"]["query"])
    return found


def series_labels(metrics_text: str) -> dict[str, set[str]]:
    """Sample name (with its _bucket/_sum/_count/_total/_info suffix) -> label names it carries."""
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return labels


def problems(exprs: list[str], exported: dict[str, set[str]]) -> list[str]:
    found = []
    for expr in exprs:
        for name in METRIC_NAME.findall(expr):
            if name not in exported:
                found.append(f"{name} is not exported (in {expr})")
        for name, matchers in SELECTOR.findall(expr):
            if not name.startswith("eagle3_target_"):
                found.append(f"{name} is not one of the server's metrics (in {expr})")
            for label, _, _ in MATCHER.findall(matchers):
                if label not in exported.get(name, set()) | TARGET_LABELS:
                    found.append(f"{name} has no label {label} (in {expr})")
    return found


@pytest.fixture
async def scraped() -> dict[str, set[str]]:
    async with (
        serve(lambda: SyntheticRunner()) as target,  # waits for /health 200: the model is loaded
        target.http.get(f"{target.url}/{contract.METRICS}") as response,
    ):
        assert response.status == 200
        return series_labels(await response.text())


async def test_every_metric_the_dashboard_queries_is_exported(scraped):
    exprs = expressions(DASHBOARD)
    assert len(exprs) >= 20
    assert problems(exprs, scraped) == []


async def test_the_check_catches_a_missing_metric_or_label(scraped):
    bad = [
        "rate(eagle3_target_request_duration_seconds[5m])",  # a histogram has only _bucket/_sum/_count series
        'sum(eagle3_target_tokens_total{phase="decode"})',
        "sum(vllm:num_requests_running{})",
    ]
    assert len(problems(bad, scraped)) == 3


def test_dashboard_shows_what_the_issue_asks_for():
    exprs = "\n".join(expressions(DASHBOARD))
    titles = [p["title"] for p in DASHBOARD["panels"]]
    wanted = {
        "ready targets": "sum(eagle3_target_ready{",
        "request rate": "sum by (endpoint) (rate(eagle3_target_requests_total{",
        "errors": 'code=~"4..|5.."',
        "/generate p50": "histogram_quantile(0.5, sum by (le) (rate(eagle3_target_request_duration_seconds_bucket{",
        "/generate p99": "histogram_quantile(0.99, sum by (le) (rate(eagle3_target_request_duration_seconds_bucket{",
        "phase p50": "histogram_quantile(0.5, sum by (le, phase) (rate(eagle3_target_generate_phase_duration",
        "phase p99": "histogram_quantile(0.99, sum by (le, phase) (rate(eagle3_target_generate_phase_duration",
        "tokens/s": "rate(eagle3_target_tokens_total{",
        "bytes/s by path": "sum by (path) (rate(eagle3_target_sent_bytes_total{",
        "in-flight": "eagle3_target_requests_in_flight{",
        "sessions": "eagle3_target_sessions_active{",
        "heartbeat age": "time() - max(eagle3_target_heartbeat_timestamp_seconds{",
        "model load time": "eagle3_target_model_load_seconds{",
        "queue depth by priority": "sum by (priority) (eagle3_target_generate_queued{",
        "queue wait p50 by priority": "histogram_quantile(0.5, sum by (le, priority) (rate(eagle3_target_generate_queue_wait",
        "queue wait p99 by priority": "histogram_quantile(0.99, sum by (le, priority) (rate(eagle3_target_generate_queue_wait",
    }
    missing = [what for what, fragment in wanted.items() if fragment not in exprs]
    assert missing == [], titles
    assert f'endpoint="{contract.GENERATE}"' in exprs
    assert set(GENERATE_PHASES) == {"decode", "forward", "projection", "copy", "encode", "send"}


def test_dashboard_is_importable_grafana_json():
    assert DASHBOARD["uid"] and DASHBOARD["title"] and DASHBOARD["schemaVersion"] >= 36
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    for panel in DASHBOARD["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


# -- every query run by a real Prometheus over real samples ---------------------------------------------

# What Grafana substitutes before it sends a query: one namespace and pod picked, and a rate window of at least
# four scrape intervals.
VARIABLES = {"$namespace": POD_LABELS["namespace"], "$pod": POD_LABELS["pod"], "$__rate_interval": "1m"}
LABEL_VALUES = re.compile(r"^label_values\((.+), ([a-z_]+)\)$")


def grafana_substitute(expr: str) -> str:
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unknown variable in {expr}"
    return expr


def test_every_dashboard_query_runs_and_returns_series(live_prometheus):
    """Parse errors fail the query (HTTP 400); a wrong metric, label or matcher value returns nothing."""
    empty = []
    for expr in map(grafana_substitute, expressions(DASHBOARD)):
        if match := LABEL_VALUES.match(expr):  # Grafana's variable query: the series API
            selector, label = match.groups()
            found = live_prometheus.api(f"label/{label}/values", **{"match[]": selector})
        else:
            found = live_prometheus.query(expr)
        if not found:
            empty.append(expr)
    assert empty == []


def test_the_live_check_catches_empty_and_broken_queries(live_prometheus):
    assert live_prometheus.query('eagle3_target_ready{pod="eagle3-target-9"}') == []
    with pytest.raises(AssertionError, match="400"):
        live_prometheus.query("sum by (pod (eagle3_target_ready)")
