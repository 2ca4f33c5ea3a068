"""The chart's alert rules: valid for promtool, firing exactly when they should (promtool test rules), and
healthy against a real Prometheus scraping a real target server."""

from __future__ import annotations

import re

import pytest
import yaml
from chart.prometheus_support import promtool, write_rules
from chart.render import CI_VALUES, MONITORING_APIS, NAMESPACE, RELEASE, one, template

ALERTS = [
    "Eagle3TargetDown",
    "Eagle3TargetNotReady",
    "Eagle3TargetFleetBelowDesired",
    "Eagle3TargetGenerateErrors",
    "Eagle3TargetGenerateLatencySLO",
]
POD = f"{RELEASE}-1"
SERIES = f'namespace="{NAMESPACE}", pod="{POD}"'
FLEET = {"namespace": NAMESPACE, "eagle3_target": RELEASE, "team": "ml"}  # team: monitoring's alertLabels


def rules(tools, values: dict[str, str] | None = None, values_file: str = "monitoring") -> dict:
    objects = template(tools, values, MONITORING_APIS, values_file=CI_VALUES[values_file])
    return one(objects, "PrometheusRule")


def run_promtool_tests(tmp_path, rule: dict, tests: list[dict]) -> None:
    write_rules(rule, tmp_path / "rules.yaml")
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests})
    )
    result = promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def healthy(pod: str) -> list[dict]:
    """Two hours of a ready target serving /generate fast and without errors."""
    labels = f'namespace="{NAMESPACE}", pod="{pod}"'
    generate = f'{labels}, endpoint="generate"'
    return [
        {"series": f"up{{{labels}}}", "values": "1x120"},
        {"series": f"eagle3_target_ready{{{labels}}}", "values": "1x120"},
        {"series": f'eagle3_target_requests_total{{{generate}, code="200"}}', "values": "0+100x120"},
        {
            "series": f'eagle3_target_request_duration_seconds_bucket{{{generate}, le="10.0"}}',
            "values": "0+100x120",
        },
        {"series": f"eagle3_target_request_duration_seconds_count{{{generate}}}", "values": "0+100x120"},
    ]


def fired(alert: str, at: str, labels: dict[str, str], annotations: dict[str, str]) -> dict:
    expected = {"exp_labels": labels, "exp_annotations": annotations}
    return {"eval_time": at, "alertname": alert, "exp_alerts": [expected]}


def fleet_annotations(target: str = RELEASE) -> dict[str, str]:
    return {
        "summary": f"Eagle3Target {target} has fewer ready targets than desired.",
        "description": f"Fewer targets of {NAMESPACE}/{target} than desired have been ready for 35m: pods pending "
        f"(no GPU?), crash-looping or still loading. `kubectl get eagle3target {target}` shows the reason.",
    }


def quiet(alert: str, at: str) -> dict:
    return {"eval_time": at, "alertname": alert, "exp_alerts": []}


def replace(series: list[dict], name: str, values: str) -> list[dict]:
    """`series` with the values of the one series whose selector starts with `name{` and names POD replaced."""
    hits = [s for s in series if s["series"].startswith(name + "{") and f'pod="{POD}"' in s["series"]]
    assert len(hits) == 1, (name, hits)
    return [{**s, "values": values} if s is hits[0] else s for s in series]


@pytest.mark.parametrize("name", ["monitoring", "autoscaled", "overrides"])
def test_promtool_check_rules(tools, tmp_path, name):
    rule = rules(tools, values_file=name)
    result = promtool("check", "rules", str(write_rules(rule, tmp_path / "rules.yaml")))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout
    assert [r["alert"] for r in rule["spec"]["groups"][0]["rules"]] == ALERTS


def test_promtool_check_catches_a_broken_expression(tools, tmp_path):
    rule = rules(tools)
    rule["spec"]["groups"][0]["rules"][0]["expr"] = "up{namespace=} == 0"
    result = promtool("check", "rules", str(write_rules(rule, tmp_path / "rules.yaml")))
    assert result.returncode != 0


def test_alerts_fire_when_they_should_and_only_then(tools, tmp_path):
    """A fleet of two: pod 1 goes down, not ready, failing or slow; pod 0 stays healthy throughout."""
    rule = rules(tools, {"target.replicas": "2"})
    base = healthy(f"{RELEASE}-0") + healthy(POD)
    pod = {"pod": POD, **FLEET}
    tests = [
        # Healthy: nothing fires, ever.
        {"interval": "1m", "input_series": base, "alert_rule_test": [quiet(a, "119m") for a in ALERTS]},
        # Down: fires after 5 minutes, with the pod named in the summary.
        {
            "interval": "1m",
            "input_series": replace(base, "up", "0x120"),
            "alert_rule_test": [
                quiet("Eagle3TargetDown", "4m"),
                fired(
                    "Eagle3TargetDown",
                    "6m",
                    {"severity": "warning", **pod},
                    {
                        "summary": f"Target {POD} does not answer /metrics.",
                        "description": f"Prometheus has failed to scrape {NAMESPACE}/{POD} for 5 minutes: the "
                        "server process is down, hung or unreachable.",
                    },
                ),
            ],
        },
        # Not ready: quiet through the default startup budget (30m) plus 5m, then the pod and the fleet alert.
        {
            "interval": "1m",
            "input_series": replace(base, "eagle3_target_ready", "0x120"),
            "alert_rule_test": [
                quiet("Eagle3TargetNotReady", "34m"),
                quiet("Eagle3TargetFleetBelowDesired", "34m"),
                fired(
                    "Eagle3TargetNotReady",
                    "36m",
                    {"severity": "warning", **pod},
                    {
                        "summary": f"Target {POD} is not ready.",
                        "description": f"{NAMESPACE}/{POD} has not served the model for 35m, longer than loading it "
                        f"may take: see its logs and `kubectl describe eagle3target {RELEASE}`.",
                    },
                ),
                fired(
                    "Eagle3TargetFleetBelowDesired",
                    "36m",
                    {"severity": "warning", **FLEET},
                    fleet_annotations(),
                ),
            ],
        },
        # 20 of 220 /generate a minute answered 5xx (threshold 5%): critical after 10 minutes.
        {
            "interval": "1m",
            "input_series": [
                *base,
                {
                    "series": f'eagle3_target_requests_total{{{SERIES}, endpoint="generate", code="500"}}',
                    "values": "0+20x120",
                },
            ],
            "alert_rule_test": [
                quiet("Eagle3TargetGenerateErrors", "9m"),
                fired(
                    "Eagle3TargetGenerateErrors",
                    "16m",
                    {"severity": "critical", **FLEET},
                    {
                        "summary": f"/generate of {RELEASE} fails.",
                        "description": f"9.091% of /generate requests to {NAMESPACE}/{RELEASE} answered 5xx over 5 "
                        "minutes (threshold 0.05).",
                    },
                ),
            ],
        },
        # Half of pod 1's requests take longer than 10 s: a quarter of the fleet's, far over the 1% budget.
        {
            "interval": "1m",
            "input_series": replace(base, "eagle3_target_request_duration_seconds_bucket", "0+50x120"),
            "alert_rule_test": [
                quiet("Eagle3TargetGenerateLatencySLO", "14m"),
                fired(
                    "Eagle3TargetGenerateLatencySLO",
                    "16m",
                    {"severity": "warning", **FLEET},
                    {
                        "summary": f"/generate of {RELEASE} is slower than its SLO.",
                        "description": f"25% of /generate requests to {NAMESPACE}/{RELEASE} took longer than 10s over "
                        "30 minutes; the objective is 0.99 within 10s.",
                    },
                ),
                quiet("Eagle3TargetGenerateErrors", "60m"),
            ],
        },
    ]
    run_promtool_tests(tmp_path, rule, tests)


def test_autoscaled_fleet_alert_counts_the_pods_the_target_owns(tools, tmp_path):
    """replicas null: desired is what kube-state-metrics sees owned by the Eagle3Target."""
    rule = rules(tools, values_file="autoscaled")
    fleet = {"namespace": NAMESPACE, "eagle3_target": RELEASE}

    def owned(pod: str) -> dict:
        labels = f'namespace="{NAMESPACE}", pod="{pod}", owner_kind="Eagle3Target", owner_name="{RELEASE}"'
        return {"series": f'kube_pod_owner{{{labels}, owner_is_controller="true"}}', "values": "1x120"}

    three = [owned(f"{RELEASE}-{i}") for i in range(3)]
    ready = [s for i in range(3) for s in healthy(f"{RELEASE}-{i}")]
    tests = [
        {
            "interval": "1m",
            "input_series": three + ready,
            "alert_rule_test": [quiet("Eagle3TargetFleetBelowDesired", "60m")],
        },
        {
            "interval": "1m",
            "input_series": three + ready[: 2 * len(healthy(POD))],  # replica 2 is Pending: no metrics at all
            "alert_rule_test": [
                quiet("Eagle3TargetFleetBelowDesired", "34m"),
                fired(
                    "Eagle3TargetFleetBelowDesired",
                    "36m",
                    {"severity": "warning", **fleet},
                    fleet_annotations(),
                ),
            ],
        },
    ]
    run_promtool_tests(tmp_path, rule, tests)


# -- against a real Prometheus scraping a real server ---------------------------------------------

SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")


def test_rules_evaluate_cleanly_and_stay_quiet_on_a_healthy_target(live_prometheus):
    evaluated = {r["name"]: r for r in live_prometheus.evaluated_rules()}
    assert sorted(evaluated) == sorted(ALERTS)
    for name, rule in evaluated.items():
        assert rule["health"] == "ok", (name, rule.get("lastError"))
        assert rule["state"] == "inactive", (name, rule["alerts"])


def test_every_rule_selector_matches_what_the_server_exports(live_prometheus, monitoring_render):
    """The namespace and pod matchers, endpoint="generate" and the SLO's le bound pick real series; only the 5xx
    selector is empty (the server answered no 5xx) and kube_pod_owner comes from kube-state-metrics."""
    rule = one(monitoring_render, "PrometheusRule")
    selectors = {
        f"{m}{{{s}}}" for r in rule["spec"]["groups"][0]["rules"] for m, s in SELECTOR.findall(r["expr"])
    }
    assert any('le="10.0"' in s for s in selectors)
    empty = [s for s in sorted(selectors) if not live_prometheus.query(s)]
    assert empty == [
        f'eagle3_target_requests_total{{namespace="{NAMESPACE}", pod=~"{RELEASE}-[0-9]+", endpoint="generate", '
        'code=~"5.."}'
    ]
