"""Names, labels and selectors come from the named helpers in templates/_helpers.tpl, everywhere."""

from __future__ import annotations

import re

import pytest
from chart.render import CHART, CI_VALUES, MONITORING_APIS, template

from eagle3_target.operator import builders

TEMPLATES = [p for p in (CHART / "templates").rglob("*") if p.is_file() and p.name != "_helpers.tpl"]
# Label keys a template would otherwise spell out: each belongs to one helper.
LABEL_KEY = re.compile(
    r"^\s*(app\.kubernetes\.io/[a-z-]+|helm\.sh/chart|eagle3\.dev/[a-z-]+)\s*:", re.MULTILINE
)


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: str(p.relative_to(CHART)))
def test_templates_spell_out_no_label_keys(path):
    assert LABEL_KEY.findall(path.read_text()) == []


def test_the_check_catches_a_literal_label():
    assert LABEL_KEY.findall("  labels:\n    app.kubernetes.io/component: operator\n") == [
        "app.kubernetes.io/component"
    ]


@pytest.fixture(scope="module")
def overridden(tools) -> list[dict]:
    return template(tools, api_versions=MONITORING_APIS, values_file=CI_VALUES["overrides"])


def test_every_name_follows_the_full_name_override(overridden):
    names = {
        (o["kind"], o["metadata"]["name"]) for o in overridden if o["kind"] != "CustomResourceDefinition"
    }
    assert names == {
        ("ServiceAccount", "fleet-a-operator"),
        ("ClusterRole", "fleet-a-operator"),
        ("ClusterRoleBinding", "fleet-a-operator"),
        ("ClusterRole", "fleet-a-operator-nodes"),
        ("ClusterRoleBinding", "fleet-a-operator-nodes"),
        ("Role", "fleet-a-operator-leader-election"),
        ("RoleBinding", "fleet-a-operator-leader-election"),
        ("Deployment", "fleet-a-operator"),
        ("Eagle3Target", "fleet-a"),
        ("NetworkPolicy", "fleet-a"),
        ("ServiceMonitor", "fleet-a"),
        ("PodMonitor", "fleet-a"),
        ("PrometheusRule", "fleet-a"),
        ("ConfigMap", "fleet-a-dashboard"),
        ("Pod", "fleet-a-test-fleet"),
    }


def test_every_object_carries_common_labels_and_name_override(overridden):
    for obj in overridden:
        if obj["kind"] == "CustomResourceDefinition":
            continue  # crds/ is not templated
        labels = obj["metadata"]["labels"]
        assert labels["team"] == "ml" and labels["cost-center"] == "4711", obj["kind"]
        assert labels["app.kubernetes.io/name"] == "e3t", obj["kind"]


def test_selectors_follow_the_target_name(overridden):
    """Whatever the overrides, the selectors pick exactly the pods the operator creates for that name."""
    by_kind = {o["kind"]: o for o in overridden}
    selector = builders.selector("fleet-a")
    assert by_kind["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"] == selector
    assert by_kind["PodMonitor"]["spec"]["selector"]["matchLabels"] == selector
    assert by_kind["ServiceMonitor"]["spec"]["selector"]["matchLabels"] == selector
    deployment = by_kind["Deployment"]
    assert (
        deployment["spec"]["selector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    for rule in by_kind["PrometheusRule"]["spec"]["groups"][0]["rules"]:
        assert 'pod=~"fleet-a-[0-9]+"' in rule["expr"], rule["alert"]
