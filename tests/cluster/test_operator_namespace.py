"""A namespace being deleted: the namespace controller removes the pods before the Eagle3Target, and the API
server refuses anything created in a terminating namespace (403). The operator leaves such targets alone, so
its audit log shows no 403 while the namespace goes."""

from __future__ import annotations

import yaml
from cluster.operator_process import StandInKubelet, eventually
from cluster.test_operator_identity import refusals, target
from cluster.test_operator_rollout import operator_for, settled


def test_no_write_is_refused_while_a_targets_namespace_is_deleted(
    crd, control_plane, kubectl, namespace, tmp_path
):
    doomed = f"{namespace}-doomed"
    kubectl("create", "namespace", doomed)
    operator = operator_for(control_plane, kubectl, tmp_path)
    try:
        kubelet = StandInKubelet(kubectl, doomed)
        spec = {"model": "m", "image": "example.test/server:1", "replicas": 3}
        kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(target(doomed, **spec)))
        settled(kubelet, kubectl, doomed, 3)
        kubectl("delete", "namespace", doomed, "--wait=false")
        eventually(
            lambda: kubectl("get", "namespace", doomed, check=False).returncode != 0,
            timeout=90,
            interval=1,
            what="the namespace gone",
        )
    finally:
        operator.stop()
    events = [
        e for e in control_plane.audit_events(operator.user) if e["objectRef"].get("namespace") == doomed
    ]
    assert events and refusals(events) == []
    assert "Forbidden" not in operator.output()
