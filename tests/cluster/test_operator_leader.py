"""Two operators, one Lease, on a real API server: only the holder writes, and SIGKILLing it in the middle of a
rollout hands the Lease over (after its 15 s duration: a killed leader cannot release it) and the other one
finishes the rollout. Each operator has its own ServiceAccount (same Roles), so the audit log tells their
requests apart."""

from __future__ import annotations

import json
import signal

import yaml
from cluster.operator_process import StandInKubelet, eventually, start_operator
from cluster.test_operator_identity import MANIFESTS, WRITES, target, wait_rolled_out

HOME = "eagle3-system"
LEASE = "eagle3-target-operator"


def bind_second_account(kubectl, name: str) -> None:
    """A second ServiceAccount bound to the manifests' ClusterRoles and Lease Role."""
    kubectl("-n", HOME, "create", "serviceaccount", name)
    for role, binding in (
        ("eagle3-target-operator", name),
        ("eagle3-target-operator-nodes", f"{name}-nodes"),
    ):
        kubectl(
            "create",
            "clusterrolebinding",
            binding,
            f"--clusterrole={role}",
            f"--serviceaccount={HOME}:{name}",
        )
    kubectl(
        "-n",
        HOME,
        "create",
        "rolebinding",
        name,
        "--role=eagle3-target-operator-leader-election",
        f"--serviceaccount={HOME}:{name}",
    )


def writes_to(control_plane, user: str, namespace: str) -> list[str]:
    return [
        f"{e['verb']} {e['requestURI']}"
        for e in control_plane.audit_events(user)
        if e["verb"] in WRITES and e["objectRef"].get("namespace") == namespace
    ]


def holder(kubectl) -> str:
    return kubectl.json("-n", HOME, "get", "lease", LEASE)["spec"].get("holderIdentity") or ""


def test_only_the_leader_writes_and_a_killed_leaders_rollout_is_finished_by_the_other(
    crd, control_plane, kubectl, namespace, tmp_path
):
    kubectl("apply", "-f", str(MANIFESTS / "namespace.yaml"), "-f", str(MANIFESTS / "rbac.yaml"))
    standby_account = f"standby-{namespace[-5:]}"
    bind_second_account(kubectl, standby_account)
    common = ("--all-namespaces", "--interval=1")
    first = start_operator(
        control_plane,
        kubectl,
        tmp_path,
        *common,
        namespace=HOME,
        service_account="eagle3-target-operator",
        name="first",
    )
    second = start_operator(
        control_plane,
        kubectl,
        tmp_path,
        *common,
        namespace=HOME,
        service_account=standby_account,
        name="second",
    )
    operators = (first, second)
    try:
        leader_id = eventually(lambda: holder(kubectl), what="a Lease holder")
        leader = next(
            op
            for op in eventually(
                lambda: [op for op in operators if f"{leader_id} acquired leadership" in op.output()],
                what="the leader's log",
            )
        )
        follower = second if leader is first else first

        kubelet = StandInKubelet(kubectl, namespace)
        spec = {"model": "m", "image": "example.test/server:1", "replicas": 3}
        kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(target(namespace, **spec)))
        wait_rolled_out(kubelet, kubectl, namespace, 3, "example.test/server:1", 8001)
        assert writes_to(control_plane, leader.user, namespace)
        assert writes_to(control_plane, follower.user, namespace) == []

        # a rollout, one pod at a time: kill the leader as soon as it replaced the first pod
        patch = json.dumps({"spec": {"image": "example.test/server:2"}})
        kubectl("-n", namespace, "patch", "e3t/llama", "--type=merge", "-p", patch)
        eventually(
            lambda: any(
                p["spec"]["containers"][0]["image"] == "example.test/server:2" for p in kubelet.pods()
            ),
            what="the leader's first replacement pod",
        )
        leader.stop(signal.SIGKILL)
        wait_rolled_out(kubelet, kubectl, namespace, 3, "example.test/server:2", 8001)
        new_id = holder(kubectl)
        assert new_id != leader_id and f"{new_id} acquired leadership" in follower.output()
        assert writes_to(control_plane, follower.user, namespace)
    finally:
        for op in operators:
            op.stop()
    assert "Forbidden" not in first.output() + second.output()
