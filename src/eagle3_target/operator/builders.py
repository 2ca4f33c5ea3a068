"""Pure functions from an Eagle3Target to the dicts of its children: target pods, the two headless Services
and the client ConfigMap. Owner references are added by the handlers."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json

from eagle3_target.protocol import contract

from . import GROUP, groups, placement
from .spec_checks import SERVER_CONTAINER
from .target_spec import ROLLOUT_FIELDS, TargetSpec
from .template import with_template as _with_template
from .volumes import CACHE_DIR, TOKEN_DIR, pod_volumes
from .weights import ADMIN_DIR, ADMIN_KEY, READINESS_GATE

MANAGER = "eagle3-target-operator"
TARGET_LABEL = f"{GROUP}/target"
ORDINAL_LABEL = f"{GROUP}/ordinal"
HASH_ANNOTATION = f"{GROUP}/spec-hash"
HF_HOME = f"{CACHE_DIR}/huggingface"
# On SIGTERM the server finishes requests in flight for up to DRAIN_SECONDS (`serve --drain-timeout`); the pod's
# grace period leaves it room beyond that to exit by itself before the kubelet kills it.
DRAIN_SECONDS = 30
TERMINATION_GRACE_SECONDS = DRAIN_SECONDS + 15
# The longest derived DNS label: `<name>-peers` (a Service name, at most 63 characters); the CRD's CEL rule
# enforces the same bound at admission.
MAX_NAME_LENGTH = 63 - len("-peers")
WHERE = ("default", "cluster.local")  # a pod's namespace and cluster domain, unless given


def labels(name: str, component: str = "target") -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "eagle3-target",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "eagle3-target",
        "app.kubernetes.io/managed-by": MANAGER,
        TARGET_LABEL: name,
    }


def selector(name: str) -> dict[str, str]:
    """What picks a target's pods (and nothing the operator did not create for it)."""
    return {TARGET_LABEL: name, "app.kubernetes.io/component": "target"}


def leader_selector(spec: TargetSpec, name: str) -> dict[str, str]:
    """The pods that are fleet endpoints: every pod, or with nodesPerReplica > 1 each group's leader."""
    if groups.spans_nodes(spec):
        return {**selector(name), groups.ROLE_LABEL: groups.LEADER}
    return selector(name)


def selector_string(name: str, spec: TargetSpec | None = None) -> str:
    chosen = leader_selector(spec, name) if spec is not None else selector(name)
    return ",".join(f"{k}={v}" for k, v in chosen.items())


def name_problems(name: str) -> list[str]:
    if len(name) > MAX_NAME_LENGTH:
        return [
            f"metadata.name has {len(name)} characters; at most {MAX_NAME_LENGTH} leave room for <name>-peers"
        ]
    return []


def pod_name(name: str, ordinal: int) -> str:
    return f"{name}-{ordinal}"


def peers_service_name(name: str) -> str:
    return f"{name}-peers"


def client_configmap_name(name: str) -> str:
    return f"{name}-client"


def server_args(spec: TargetSpec, ordinal: int) -> list[str]:
    ports = spec.ports_for(ordinal)
    args = [
        "--model",
        spec.model,
        "--engine",
        spec.engine,
        "--dtype",
        spec.dtype,
        "--device",
        "cuda" if spec.gpus_per_replica > 0 else "cpu",
        "--host",
        "$(POD_IPS)",  # every address of the pod: one per family on a dual-stack cluster
        "--port",
        str(ports.http),
        "--nccl-port-range",
        ports.nccl_range,
        "--drain-timeout",
        str(DRAIN_SECONDS),
    ]
    if spec.aux_layer_ids is not None:
        args += ["--aux-layer-ids", ",".join(str(i) for i in spec.aux_layer_ids)]
    if spec.auth_secret_name:
        args += ["--auth-token-file", f"{TOKEN_DIR}/token"]
    # on every pod, so that setting spec.weights later refreshes it in place rather than replacing it
    args += ["--admin-token-file", f"{ADMIN_DIR}/{ADMIN_KEY}"] + spec.generation.server_args()
    # every GPU of the pod serves: gpusPerReplica becomes the tensor-parallel size (groups.default_split)
    return args + groups.split_args(spec, groups.TENSOR_FLAG) + list(spec.args)


def _container_ports(spec: TargetSpec, ordinal: int) -> list[dict]:
    """Every port is declared: with hostNetwork the scheduler then keeps two pods off the same host ports, and
    the named ports let the Services' SRV records carry each pod's own port."""
    ports = spec.ports_for(ordinal)
    named = [("http", ports.http)]
    named += [("nccl" if i == 0 else f"nccl-{i}", port) for i, port in enumerate(ports.nccl_ports)]
    result = []
    for port_name, port in named:
        entry = {"name": port_name, "containerPort": port, "protocol": "TCP"}
        if spec.host_network:
            entry["hostPort"] = port
        result.append(entry)
    return result


def _resources(spec: TargetSpec) -> dict:
    resources = copy.deepcopy(spec.resources)
    if spec.gpus_per_replica > 0:
        resources.setdefault("limits", {})[spec.gpu_resource_name] = spec.gpus_per_replica
    return resources


def _probe(path: str, timing) -> dict:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": timing.period_seconds,
        "failureThreshold": timing.failure_threshold,
        "timeoutSeconds": timing.timeout_seconds,
    }


def _env(spec: TargetSpec, ordinal: int) -> list[dict]:
    ports = spec.ports_for(ordinal)
    env = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_IPS", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": contract.HTTP_PORT_ENV, "value": str(ports.http)},
        {"name": contract.NCCL_PORT_RANGE_ENV, "value": ports.nccl_range},
        {"name": "HF_HOME", "value": HF_HOME},
        {"name": "HF_HUB_CACHE", "value": f"{HF_HOME}/hub"},
        {"name": "HOME", "value": "/tmp"},
    ]
    if spec.hf_token_secret:
        secret, key = spec.hf_token_secret
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    return env + [copy.deepcopy(e) for e in spec.env]  # later entries win, so user env can override


def _probes(spec: TargetSpec, rank: int) -> dict:
    """Workers serve /livez only: it is their readiness too (the leader's readiness covers the group)."""
    ready = contract.READINESS_PATH if rank == 0 else contract.LIVENESS_PATH
    return {
        "startupProbe": _probe(ready, spec.startup_probe),
        "readinessProbe": _probe(ready, spec.readiness_probe),
        "livenessProbe": _probe(contract.LIVENESS_PATH, spec.liveness_probe),
    }


def _group_args(spec: TargetSpec, name: str, ordinal: int, rank: int, where: tuple[str, str]) -> list[str]:
    if not groups.spans_nodes(spec):
        return []
    master = groups.leader_address(pod_name(name, ordinal), peers_service_name(name), *where)
    # the last port of the replica's NCCL block is the group's rendezvous port (declared like the others)
    return groups.server_args(spec, rank, master, spec.ports_for(ordinal).nccl_end)


def pod_spec(spec: TargetSpec, name: str, ordinal: int, image: str, rank: int = 0, where=WHERE) -> dict:
    """The pod spec of one replica (or of rank `rank` of a group): its ordinal (hostname, ports) is its
    identity, not the pod's name. `where`: the namespace and cluster domain, for a worker's leader address."""
    volumes, mounts = pod_volumes(spec, name)
    container = {
        "name": SERVER_CONTAINER,
        "image": image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["eagle3-target", "serve"],
        "args": server_args(spec, ordinal) + _group_args(spec, name, ordinal, rank, where),
        "env": _env(spec, ordinal),
        "ports": _container_ports(spec, ordinal),
        "resources": _resources(spec),
        **_probes(spec, rank),
        "volumeMounts": mounts,
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    result = {
        "hostname": groups.member_hostname(pod_name(name, ordinal), rank),
        "subdomain": peers_service_name(name),
        "restartPolicy": "Always",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
        "topologySpreadConstraints": placement.spread(selector(name)),
    }
    if spec.weights is not None and rank == 0:  # an endpoint only once it serves spec.weights
        result["readinessGates"] = [{"conditionType": READINESS_GATE}]
    if spec.host_network:
        result["hostNetwork"] = True
        result["dnsPolicy"] = "ClusterFirstWithHostNet"
    if spec.service_account_name:
        result["serviceAccountName"] = spec.service_account_name
    if spec.node_selector:
        result["nodeSelector"] = dict(spec.node_selector)
    if spec.affinity:
        result["affinity"] = copy.deepcopy(spec.affinity)
    if spec.image_pull_secrets:
        result["imagePullSecrets"] = [dict(s) for s in spec.image_pull_secrets]
    merged = _with_template(result, spec.pod_template.get("spec") or {})
    gpu = spec.gpu_resource_name if spec.gpus_per_replica > 0 and spec.tolerate_gpu_taint else None
    user = [copy.deepcopy(t) for t in spec.tolerations] + merged.get("tolerations", [])
    merged["tolerations"] = placement.tolerations(user, gpu, spec.node_failure_tolerance_seconds)
    return merged


def revision(spec: TargetSpec) -> str:
    """Digest of what the user set: the fields that differ from their defaults, less those that only steer
    rollouts. Neither the operator's default image nor a field a newer CRD or operator adds with a default
    changes it, so upgrading the operator restarts no pod; scaling does not either."""
    blank = TargetSpec(model="")
    written = {
        f.name: getattr(spec, f.name)
        for f in dataclasses.fields(spec)
        if f.name not in ROLLOUT_FIELDS and getattr(spec, f.name) != getattr(blank, f.name)
    }
    encoded = json.dumps(written, sort_keys=True, default=dataclasses.asdict)
    return hashlib.sha256(encoded.encode()).hexdigest()[:16]


def pod(
    spec: TargetSpec,
    name: str,
    namespace: str,
    ordinal: int,
    image: str,
    pod_name_: str = "",
    rank: int = 0,
    cluster_domain: str = "cluster.local",
) -> dict:
    """Replica `ordinal` under `pod_name_` (default `<name>-<ordinal>`), stamped with the spec's revision.
    With nodesPerReplica > 1 that name is the group's, and `rank` picks the group's member."""
    template = spec.pod_template.get("metadata") or {}
    group = pod_name_ or pod_name(name, ordinal)
    member = groups.member_labels(group, rank) if groups.spans_nodes(spec) else {}
    body_spec = pod_spec(spec, name, ordinal, image, rank, (namespace, cluster_domain))
    result = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": groups.member_name(group, rank),
            "namespace": namespace,
            # the operator's own labels and annotation win: they select the pod and track its revision
            "labels": {
                **(template.get("labels") or {}),
                **labels(name),
                ORDINAL_LABEL: str(ordinal),
                placement.REVISION_LABEL: revision(spec),
                **member,
            },
            "annotations": {**(template.get("annotations") or {}), HASH_ANNOTATION: revision(spec)},
        },
        "spec": groups.with_anti_affinity(body_spec, group) if member else body_spec,
    }
    return result
