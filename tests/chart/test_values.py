"""values.schema.json turns bad values away with a message naming the field; NOTES.txt tells a trainer where to go."""

from __future__ import annotations

import json
import re

import pytest
from chart.render import CHART, NAMESPACE, RELEASE, helm, install_dry_run, set_args

from eagle3_target.operator import builders

BAD_VALUES = [
    ({"target.replicas": "-1"}, "at '/target/replicas': minimum: got -1, want 0"),
    ({"target.gpusPerReplica": "17"}, "at '/target/gpusPerReplica': maximum: got 17, want 16"),
    ({"target.engine": '"TGI"'}, "at '/target/engine'"),
    ({"target.dtype": '"int4"'}, "at '/target/dtype'"),
    ({"target.auxLayerIds": "[1, 2]"}, "minItems: got 2, want 3"),
    ({"target.model": '""'}, "at '/target/model'"),
    ({"target.ports.http": "80"}, "at '/target/ports/http': minimum: got 80"),
    ({"target.hostNetwork": '"yes"'}, "at '/target/hostNetwork': got string, want boolean"),
    ({"target.weights": '{"source": "gs://b/ft", "version": "ft"}'}, "at '/target/weights/source'"),
    ({"target.weights": '{"source": "/m/ft"}'}, "at '/target/weights'"),
    ({"target.generation.maxTokens": "0"}, "at '/target/generation/maxTokens': minimum: got 0, want 1"),
    ({"target.generation.enabled": '"yes"'}, "at '/target/generation/enabled': got string, want boolean"),
    ({"target.gpus": "1"}, "at '/target': additional properties 'gpus' not allowed"),
    ({"target.name": '"Fleet_A"'}, "at '/target/name'"),
    ({"target.modelVolume": '{"mountPath": "/models"}'}, "missing property 'persistentVolumeClaim'"),
    ({"target.authTokenSecret": '{"key": "token"}'}, "missing property 'name'"),
    ({"operator.watchNamespaces": '["Not A Namespace"]'}, "at '/operator/watchNamespaces/0'"),
    ({"networkPolicy.trainerSelector": "null"}, "at '/networkPolicy': missing property 'trainerSelector'"),
    (
        {"networkPolicy.trainerSelector": '{"role": 1}'},
        "at '/networkPolicy/trainerSelector/role': got number, want string",
    ),
    ({"podDisruptionBudget.maxUnavailable": '"half"'}, "at '/podDisruptionBudget/maxUnavailable'"),
    ({"monitoring.serviceMonitor.interval": '"5 minutes"'}, "does not match pattern"),
    ({"monitring": "{}"}, "additional properties 'monitring' not allowed"),
    (
        {"monitoring.serviceMonitor.additionalLabels": '{"release": "kps"}'},
        "additional properties 'additionalLabels' not allowed",  # renamed to labels
    ),
    (
        {"operator.resources.requests": "null"},
        "at '/operator/resources': missing property 'requests'",
    ),
    ({"operator.resources.requests.memory": "null"}, "missing property 'memory'"),
    ({"monitoring.prometheusRule.latencySeconds": "7"}, "at '/monitoring/prometheusRule/latencySeconds'"),
    ({"monitoring.prometheusRule.latencyObjective": "1"}, "at '/monitoring/prometheusRule/latencyObjective'"),
    (
        {"podDisruptionBudget.unhealthyPodEvictionPolicy": '"Never"'},
        "additional properties 'unhealthyPodEvictionPolicy' not allowed",  # the operator's budget always allows
    ),
    ({"podDisruptionBudget.maxUnavailable": "-1"}, "at '/podDisruptionBudget/maxUnavailable'"),
    ({"clusterDomain": '"cluster.local."'}, "at '/clusterDomain'"),
    ({"tests.image": '""'}, "at '/tests/image'"),
    ({"target.replicas": '"2"'}, "at '/target/replicas': got string, want null or integer"),
    # Rules JSON schema cannot say, checked by the templates with the same clarity.
    (
        {"target.ports.nccl.end": "29000"},
        "target.ports.nccl.end (29000) must not be below target.ports.nccl.start",
    ),
    (
        {"operator.watchNamespaces": '["research"]'},
        f"operator.watchNamespaces [research] leaves out the release namespace {NAMESPACE}",
    ),
]


@pytest.mark.parametrize("values,message", BAD_VALUES, ids=[next(iter(v)) for v, _ in BAD_VALUES])
def test_bad_values_are_rejected_with_a_clear_message(tools, values, message):
    result = helm(tools, "template", RELEASE, str(CHART), "-n", NAMESPACE, *set_args(values), check=False)
    assert result.returncode != 0, f"{values} was accepted"
    assert message in result.stderr, result.stderr


def test_schema_is_strict_draft_07():
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"

    def objects(node, path="$"):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                yield path, node
            for key, value in node.items():
                yield from objects(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                yield from objects(value, f"{path}[{i}]")

    open_objects = [p for p, node in objects(schema) if node.get("additionalProperties") is not False]
    assert open_objects == []


def test_notes_name_the_dns_a_trainer_uses_and_the_fleet(tools):
    notes = install_dry_run(tools, {"target.replicas": "2"}).split("NOTES:", 1)[1]
    fqdn = f"{RELEASE}.{NAMESPACE}.svc.cluster.local"
    assert f"_http._tcp.{fqdn}" in notes
    assert f"{fqdn}:8001" in notes
    assert f"{RELEASE}-<i>.{RELEASE}-peers.{NAMESPACE}.svc.cluster.local" in notes
    assert f"kubectl get eagle3target {RELEASE} -n {NAMESPACE}" in notes
    (selector,) = re.findall(rf"kubectl get pods -n {NAMESPACE} -l (\S+) -o wide", notes)
    assert dict(pair.split("=") for pair in selector.split(",")) == builders.selector(RELEASE)
    assert "2 replica(s)" in notes
    assert f"name: {RELEASE}-client" in notes
    assert "kubectl apply --server-side" in notes  # the CRD upgrade path
    assert "WARNING" not in notes


def test_notes_warn_about_host_network_and_missing_monitoring_api(tools):
    values = {
        "target.hostNetwork": "true",
        "networkPolicy.enabled": "true",
        "monitoring.serviceMonitor.enabled": "true",
    }
    notes = install_dry_run(tools, values).split("NOTES:", 1)[1]
    assert "networkPolicy.enabled has no effect: pods on the host network are outside NetworkPolicy" in notes
    assert "privileged Pod Security level" in notes
    assert "no monitoring.coreos.com/v1 API" in notes


def test_notes_follow_the_cluster_domain_and_a_scaler_owned_count(tools):
    notes = install_dry_run(tools, {"target.replicas": "null", "clusterDomain": '"k8s.internal"'}).split(
        "NOTES:", 1
    )[1]
    assert f"_http._tcp.{RELEASE}.{NAMESPACE}.svc.k8s.internal" in notes
    assert "target.replicas is null" in notes and "<nil>" not in notes
