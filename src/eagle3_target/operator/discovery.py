"""How trainers and peers find a target: the two headless Services and the client ConfigMap, which exist once
per target (pods, one per ordinal, are built in builders.py)."""

from __future__ import annotations

from eagle3_target.protocol import contract

from . import groups
from .builders import client_configmap_name, labels, leader_selector, peers_service_name, selector
from .disruption import pod_disruption_budget
from .target_spec import TargetSpec


def _service(service_name: str, name: str, namespace: str, spec: TargetSpec, publish_not_ready: bool) -> dict:
    # targetPort by name: each endpoint (and SRV record) carries its own pod's port, which differs per replica
    # with hostNetwork; `port` is the shared one for the A-record form.
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service_name, "namespace": namespace, "labels": labels(name)},
        "spec": {
            "clusterIP": "None",
            "selector": selector(name),
            # only when true: the server drops a false value, and a field we send that it drops would read as
            # drift on every reconcile
            **({"publishNotReadyAddresses": True} if publish_not_ready else {}),
            "ports": [
                {"name": "http", "port": spec.http_port, "targetPort": "http", "protocol": "TCP"},
                {"name": "nccl", "port": spec.nccl_start, "targetPort": "nccl", "protocol": "TCP"},
            ],
        },
    }


def service(spec: TargetSpec, name: str, namespace: str) -> dict:
    """Ready targets only (with groups: ready leaders only): what trainers resolve."""
    result = _service(name, name, namespace, spec, publish_not_ready=False)
    result["spec"]["selector"] = leader_selector(spec, name)
    return result


def peers_service(spec: TargetSpec, name: str, namespace: str) -> dict:
    """All targets, ready or not: per-pod DNS names and rendezvous before readiness."""
    return _service(peers_service_name(name), name, namespace, spec, publish_not_ready=True)


def client_env(
    spec: TargetSpec, name: str, namespace: str, cluster_domain: str = "cluster.local"
) -> dict[str, str]:
    fqdn = f"{name}.{namespace}.svc.{cluster_domain}"
    return {
        contract.SERVICE_ENV: f"srv://_http._tcp.{fqdn}",
        contract.SERVICE_DNS_ENV: f"dns://{fqdn}:{spec.http_port}",
    }


def client_configmap(
    spec: TargetSpec, name: str, namespace: str, cluster_domain: str = "cluster.local"
) -> dict:
    """What a trainer pod pulls in with envFrom to find the targets."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": client_configmap_name(name),
            "namespace": namespace,
            "labels": labels(name, "client"),
        },
        "data": client_env(spec, name, namespace, cluster_domain),
    }


def children(
    spec: TargetSpec, name: str, namespace: str, cluster_domain: str = "cluster.local"
) -> list[dict]:
    """The children that exist once per target (pods are per ordinal); the PodDisruptionBudget while on."""
    return [
        service(spec, name, namespace),
        peers_service(spec, name, namespace),
        client_configmap(spec, name, namespace, cluster_domain),
    ] + (
        [
            groups.in_pods(
                spec, pod_disruption_budget(spec.disruption, name, namespace, labels(name), selector(name))
            )
        ]
        if spec.disruption.enabled
        else []
    )
