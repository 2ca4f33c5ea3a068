"""How the operator finds the API server and its own namespace inside a pod, as client-go's in-cluster config
does: the ServiceAccount's files, and the API server at KUBERNETES_SERVICE_HOST/PORT (which the kubelet sets,
and a hostNetwork pod can set explicitly). Outside a pod, $KUBECONFIG."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import kopf

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def api_server() -> str | None:
    """https://host:port from the kubelet's KUBERNETES_SERVICE_* variables, or None outside a pod."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not (host and port):
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's service-account login names https://kubernetes.default.svc, which resolves only through cluster
    DNS (not from a hostNetwork pod without it, nor on clusters with another domain): use the address the
    kubelet gives instead, as client-go and kr8s do."""
    info = kopf.login_with_service_account(**kwargs)
    if info is None:
        return kopf.login_with_kubeconfig(**kwargs)
    server = api_server()
    return dataclasses.replace(info, server=server) if server else info


def own_namespace(fallback: str) -> str:
    """The operator's namespace: its ServiceAccount's in a pod (kr8s 0.20 never reads that file and reports
    "default" there), else `fallback` (the kubeconfig context's)."""
    try:
        return (SERVICE_ACCOUNT / "namespace").read_text().strip() or fallback
    except OSError:
        return fallback
