"""The CRD on a real API server: accepted when applied server-side, every CEL rule and schema bound enforced
by the server itself with the project's message, defaulting and pruning as crd_support models them (the kmock
tier relies on that model), printer columns, the scale subresource and a status written only via /status."""

from __future__ import annotations

import json

import pytest
import yaml
from crd_support import crd_schema, default, prune

from eagle3_target.operator import builders

API_VERSION = "eagle3.dev/v1alpha1"


def target(namespace: str, name: str = "llama", **spec) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": "Eagle3Target",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"model": "m", **spec},
    }


def dry_run_create(kubectl, obj: dict, *flags: str):
    """What the server answers to creating `obj` (validation, defaulting, pruning, admission; nothing stored)."""
    return kubectl(
        "create", "--dry-run=server", "-o", "json", *flags, "-f", "-", input=json.dumps(obj), check=False
    )


def test_the_crd_is_accepted_established_and_served(crd, kubectl):
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True" and conditions["NamesAccepted"] == "True"
    resources = kubectl("api-resources", "--api-group=eagle3.dev", "-o", "name").stdout.split()
    assert resources == ["eagle3targets.eagle3.dev"]


LONGEST = "x" * builders.MAX_NAME_LENGTH


@pytest.mark.parametrize(
    "name, spec, refusal",
    [
        ("llama", {}, None),
        (LONGEST, {}, None),
        (LONGEST + "x", {}, "metadata.name must be at most 57 characters"),
        ("llama", {"modelVolume": {"persistentVolumeClaim": {"claimName": "c"}}}, None),
        (
            "llama",
            {"modelVolume": {"mountPath": "/m"}},
            "set exactly one of persistentVolumeClaim and volumeSource",
        ),
        (
            "llama",
            {"ports": {"nccl": {"start": 30000, "end": 29999}}},
            "nccl.end must not be below nccl.start",
        ),
        ("llama", {"ports": {"nccl": {"start": 30000}}}, "nccl.end must not be below nccl.start"),
        ("llama", {"updateStrategy": {"maxSurge": "25%", "maxUnavailable": 0}}, None),
        ("llama", {"updateStrategy": {"maxSurge": 1, "maxUnavailable": 0}}, None),
        ("llama", {"updateStrategy": {"partition": 1}}, None),
        (
            "llama",
            {"updateStrategy": {"maxSurge": "lots"}},
            "non-negative integers or percentages like '25%'",
        ),
        (
            "llama",
            {"updateStrategy": {"maxUnavailable": -1}},
            "non-negative integers or percentages like '25%'",
        ),
        ("llama", {"updateStrategy": {"maxSurge": 0, "maxUnavailable": 0}}, "must not both be 0"),
        ("llama", {"engine": "vllm"}, None),
        ("llama", {"engine": "TGI"}, 'spec.engine: Invalid value: "TGI"'),
        (
            "llama",
            {"replicas": 1, "disruption": {"maxUnavailable": 0}},
            None,
        ),  # allowed; DrainsBlocked says so
        ("llama", {"replicas": 0, "disruption": {"maxUnavailable": 2}}, None),  # scaled to zero
        (
            "llama",
            {"replicas": 2, "disruption": {"maxUnavailable": 3}},
            "disruption.maxUnavailable must not be larger than replicas",
        ),
        ("llama", {"disruption": {"maxUnavailable": -1}}, "disruption.maxUnavailable must not be negative"),
        ("llama", {"disruption": {"minAvailable": -1}}, "disruption.minAvailable must not be negative"),
        (
            "llama",
            {"disruption": {"maxUnavailable": 1, "minAvailable": 1}},
            "set disruption.maxUnavailable or disruption.minAvailable, not both",
        ),
        ("llama", {"nodeFailureToleranceSeconds": -5}, "nodeFailureToleranceSeconds must not be negative"),
        ("llama", {"nodesPerReplica": 0}, "nodesPerReplica must be at least 1"),
        (
            "llama",
            {"nodesPerReplica": 2, "groupScheduleTimeoutSeconds": 0},
            "groupScheduleTimeoutSeconds must be greater than 0",
        ),
        ("llama", {"nodesPerReplica": 4, "groupScheduleTimeoutSeconds": 120}, None),
        ("llama", {"replicas": -1}, "spec.replicas: Invalid value: -1"),
        ("llama", {"auxLayerIds": [1, 2]}, "spec.auxLayerIds: Invalid value"),
        ("llama", {"ports": {"http": 80}}, "spec.ports.http: Invalid value: 80"),
        ("llama", {"dtype": "int8"}, 'spec.dtype: Unsupported value: "int8"'),
        ("llama", {"gpusPerReplica": 17}, "spec.gpusPerReplica: Invalid value: 17"),
        ("llama", {"model": ""}, "spec.model: Invalid value"),
        ("llama", {"generation": {"enabled": False}}, None),
        ("llama", {"generation": {"maxTokens": 4096}}, None),
        (
            "llama",
            {"generation": {"enabled": False, "maxTokens": 10}},
            "generation.maxTokens needs generation.enabled true",
        ),
        ("llama", {"generation": {"maxTokens": 0}}, "spec.generation.maxTokens: Invalid value: 0"),
        ("llama", {"weights": {"source": "/models/ft-2", "version": "ft-2"}}, None),
        ("llama", {"weights": {"source": "s3://bucket/ft-2", "version": "2026-12-01T00:00+rl.7"}}, None),
        (
            "llama",
            {"weights": {"source": "gs://bucket/ft", "version": "ft"}},
            "weights.source must be an absolute path in the pod or an s3:// URI",
        ),
        (
            "llama",
            {"weights": {"source": "/m", "version": ""}},
            "weights.version must be 1 to 128 letters, digits and ._:+/- starting with a letter or digit",
        ),
        (
            "llama",
            {"weights": {"source": "/m", "version": "-x y"}},
            "weights.version must be 1 to 128 letters",
        ),
        ("llama", {"weights": {"source": "/m"}}, "spec.weights.version: Required value"),
    ],
)
def test_the_server_refuses_what_cannot_work_with_the_projects_message(
    crd, kubectl, namespace, name, spec, refusal
):
    answer = dry_run_create(kubectl, target(namespace, name, **spec))
    if refusal is None:
        assert answer.returncode == 0, answer.stderr
    else:
        assert answer.returncode != 0 and refusal in answer.stderr, answer.stderr


def test_the_model_is_required(crd, kubectl, namespace):
    obj = target(namespace)
    del obj["spec"]["model"]
    answer = dry_run_create(kubectl, obj)
    assert answer.returncode != 0 and "spec.model: Required value" in answer.stderr, answer.stderr


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"ports": {"http": 9000}, "updateStrategy": {"partition": 1}, "modelCache": {"sizeLimit": "1Ti"}},
        {"replicas": 3, "bogus": 1, "probes": {"startup": {"periodSeconds": 5, "bogus": True}}},
    ],
)
def test_defaults_and_pruning_are_what_the_offline_model_says(crd, kubectl, namespace, spec):
    """The server fills defaults and drops undeclared fields exactly as crd_support's prune/default do, the
    model the kmock tier gives the operator."""
    answer = dry_run_create(kubectl, target(namespace, **spec), "--validate=false")
    assert answer.returncode == 0, answer.stderr
    stored = json.loads(answer.stdout)
    schema = crd_schema()
    expected = default(schema, prune(schema, target(namespace, **spec)))
    assert stored["spec"] == expected["spec"]
    assert stored["status"] == schema["properties"]["status"]["default"]  # kstatus reads "in progress"
    assert "bogus" not in json.dumps(stored)


def columns(kubectl, namespace: str, *flags: str) -> list[dict[str, str]]:
    """`kubectl get eagle3targets` as one {header: cell} per row (cells cut at the header's offsets)."""
    header, *rows = kubectl("-n", namespace, "get", "eagle3targets", *flags).stdout.splitlines()
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    return [{header[a:b].strip(): row[a:b].strip() for a, b in bounds} for row in rows]


def test_printer_columns_scale_and_status_subresources(crd, control_plane, kubectl, namespace):
    kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(target(namespace, replicas=2)))
    (row,) = columns(kubectl, namespace)
    assert list(row) == [
        "NAME",
        "READY",
        "REASON",
        "DESIRED",
        "READYREPLICAS",
        "UPDATED",
        "WAITING",
        "VERSION",
        "ATVERSION",
        "AGE",
    ]
    assert row["READY"] == "Unknown" and row["REASON"] == "Pending" and row["DESIRED"] == "2"
    assert row["READYREPLICAS"] == row["UPDATED"] == ""
    assert columns(kubectl, namespace, "-o", "wide")[0]["MODEL"] == "m"  # priority 1: only in -o wide

    # status goes through /status only: the main resource ignores it, /status ignores the spec
    kubectl("-n", namespace, "patch", "e3t/llama", "--type=merge", "-p", '{"status": {"replicas": 9}}')
    assert "replicas" not in kubectl.json("-n", namespace, "get", "e3t/llama")["status"]
    status = {
        "replicas": 2,
        "readyReplicas": 1,
        "updatedReplicas": 2,
        "targetVersion": "ft-2",
        "targetVersionReplicas": 1,
        "selector": builders.selector_string("llama"),
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "PodsStarting",
                "message": "1 of 2 ready",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            },
        ],
    }
    patch = json.dumps({"spec": {"replicas": 7}, "status": status})
    kubectl("-n", namespace, "patch", "e3t/llama", "--subresource=status", "--type=merge", "-p", patch)
    stored = kubectl.json("-n", namespace, "get", "e3t/llama")
    assert stored["spec"]["replicas"] == 2 and stored["status"]["readyReplicas"] == 1
    (row,) = columns(kubectl, namespace)
    assert [
        row[c] for c in ("READY", "REASON", "DESIRED", "READYREPLICAS", "UPDATED", "VERSION", "ATVERSION")
    ] == [
        "False",
        "PodsStarting",
        "2",
        "1",
        "2",
        "ft-2",
        "1",
    ]

    # kubectl scale (and an HPA) go through /scale: spec from .spec.replicas, the rest from the status
    kubectl("-n", namespace, "scale", "eagle3target", "llama", "--replicas", "4")
    scale = kubectl.json("-n", namespace, "get", "e3t/llama", "--subresource=scale")
    assert scale["spec"] == {"replicas": 4}
    assert scale["status"] == {"replicas": 2, "selector": builders.selector_string("llama")}
    assert kubectl.json("-n", namespace, "get", "e3t/llama")["spec"]["replicas"] == 4
    writes = [
        (e["verb"], e["objectRef"].get("subresource"))
        for e in control_plane.audit_events("admin")
        if e["objectRef"].get("namespace") == namespace and e["verb"] in ("patch", "update")
    ]
    assert writes[-1] == ("patch", "scale")
