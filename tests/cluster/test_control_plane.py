"""The tier's own fixture: a real API server with RBAC, its audit log, and ServiceAccount tokens."""

from __future__ import annotations

import dataclasses


def test_a_minted_token_is_a_real_identity_that_rbac_refuses(control_plane, kubectl, namespace, tmp_path):
    kubectl("-n", namespace, "create", "serviceaccount", "nobody")
    token = kubectl("-n", namespace, "create", "token", "nobody").stdout.strip()
    config = control_plane.write_kubeconfig(tmp_path / "nobody.kubeconfig", token=token, namespace=namespace)
    refused = dataclasses.replace(kubectl, config=config)("get", "pods", check=False)
    assert refused.returncode != 0
    assert f'User "system:serviceaccount:{namespace}:nobody" cannot list resource "pods"' in refused.stderr
    user = f"system:serviceaccount:{namespace}:nobody"
    events = control_plane.audit_events(user)
    assert [(e["verb"], e["objectRef"]["resource"], e["responseStatus"]["code"]) for e in events] == [
        ("list", "pods", 403)
    ]
