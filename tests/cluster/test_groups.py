"""Replicas that span nodes (spec.nodesPerReplica) on the real API server, scheduler and controllers with hollow
nodes (hollow.py): a group's pods on distinct nodes, only leaders behind the Service, a deleted worker taking
its whole group down and back, a group that cannot be placed giving its pods back, and status and /scale
counting groups. Hollow pods run nothing; nothing here connects to their addresses."""

from __future__ import annotations

import yaml
from cluster.hollow import ON_HOLLOW
from cluster.operator_process import eventually
from cluster.test_operator_identity import target
from cluster.test_operator_rollout import SELECTOR

GROUP, ROLE = "eagle3.dev/group", "eagle3.dev/role"


def apply(kubectl, namespace: str, **spec) -> None:
    body = target(namespace, model="m", image="example.test/server:1", engine="vllm", **{**ON_HOLLOW, **spec})
    kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(body))


def live_pods(kubectl, namespace: str) -> list[dict]:
    items = kubectl.json("-n", namespace, "get", "pods", "-l", SELECTOR)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def groups_of(pods: list[dict]) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for pod in pods:
        found.setdefault(pod["metadata"]["labels"][GROUP], []).append(pod)
    return found


def all_ready(kubectl, namespace: str, count: int) -> list[dict] | None:
    pods = live_pods(kubectl, namespace)
    status = kubectl.json("-n", namespace, "get", "e3t", "llama").get("status", {})
    if len(pods) == count and all(ready(p) for p in pods) and status.get("readyReplicas") == count // 2:
        return pods
    return None


def endpoint_pods(kubectl, namespace: str) -> set[str]:
    slices = kubectl.json("-n", namespace, "get", "endpointslices", "-l", "kubernetes.io/service-name=llama")
    return {
        e["targetRef"]["name"]
        for s in slices["items"]
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready")
    }


def test_groups_span_distinct_nodes_serve_through_leaders_and_are_recreated_whole(
    hollow_operator, kubectl, namespace
):
    apply(kubectl, namespace, replicas=2, gpusPerReplica=8, nodesPerReplica=2)
    pods = eventually(lambda: all_ready(kubectl, namespace, 4), timeout=120, what="two ready groups of two")
    by_group = groups_of(pods)
    assert sorted(by_group) == ["llama-0", "llama-1"]
    for name, members in by_group.items():
        assert len({p["spec"]["nodeName"] for p in members}) == 2, "a group's ranks share a node"
        worker = next(p for p in members if p["metadata"]["labels"][ROLE] == "worker")
        args = worker["spec"]["containers"][0]["args"]
        assert args[args.index("--master-addr") + 1] == f"{name}.llama-peers.{namespace}.svc.cluster.local"
    eventually(
        lambda: endpoint_pods(kubectl, namespace) == {"llama-0", "llama-1"}, timeout=30, what="leaders"
    )
    status = kubectl.json("-n", namespace, "get", "e3t", "llama")["status"]
    assert (status["replicas"], status["readyReplicas"], len(status["endpoints"])) == (2, 2, 2)
    scale = kubectl.json("-n", namespace, "get", "e3t", "llama", "--subresource=scale")
    assert scale["spec"]["replicas"] == 2 and scale["status"]["replicas"] == 2
    assert f"{ROLE}=leader" in scale["status"]["selector"]
    budget = kubectl.json("-n", namespace, "get", "pdb", "llama")["spec"]
    assert budget["minAvailable"] == 3, budget  # four pods, one eviction breaks at most one group

    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
    kubectl("-n", namespace, "delete", "pod", "llama-1-w1", "--wait=false")

    def recreated():
        now = all_ready(kubectl, namespace, 4)
        return now if now and before["llama-1"] != _uid(now, "llama-1") else None

    after = eventually(recreated, timeout=120, what="group llama-1 recreated whole")
    assert _uid(after, "llama-1-w1") != before["llama-1-w1"]
    assert _uid(after, "llama-0") == before["llama-0"] and _uid(after, "llama-0-w1") == before["llama-0-w1"]
    events = kubectl.json("-n", namespace, "get", "events", "--field-selector", "involvedObject.name=llama")
    deleted = [e["message"] for e in events["items"] if e["reason"] == "DeletedPod"]
    assert "deleted pod llama-1" in deleted, deleted


def _uid(pods: list[dict], name: str) -> str:
    return next(p["metadata"]["uid"] for p in pods if p["metadata"]["name"] == name)


def test_a_group_that_cannot_be_placed_gives_its_pods_back_and_says_why(hollow_operator, kubectl, namespace):
    # five ranks that must each have their own node, on four nodes: four are placed, one never is
    apply(kubectl, namespace, replicas=1, gpusPerReplica=1, nodesPerReplica=5, groupScheduleTimeoutSeconds=8)
    eventually(
        lambda: sum(bool(p["spec"].get("nodeName")) for p in live_pods(kubectl, namespace)) == 4,
        timeout=60,
        what="four of five ranks placed",
    )

    def row() -> str:
        return kubectl("-n", namespace, "get", "eagle3target", "llama", "--no-headers").stdout

    eventually(lambda: "GroupUnschedulable" in row(), timeout=60, what="the group given back")
    assert "1 of 5 pods not scheduled within 8 s" in row()
    eventually(lambda: live_pods(kubectl, namespace) == [], timeout=30, what="every pod of the group gone")
    status = kubectl.json("-n", namespace, "get", "e3t", "llama")["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "GroupUnschedulable" and "anti-affinity" in degraded["message"], degraded
    events = kubectl.json("-n", namespace, "get", "events", "--field-selector", "involvedObject.name=llama")
    warnings = [e for e in events["items"] if e["type"] == "Warning" and e["reason"] == "GroupUnschedulable"]
    assert len(warnings) == 1 and "1 of 5 pods not scheduled" in warnings[0]["message"], warnings


def test_scale_counts_groups(hollow_operator, kubectl, namespace):
    apply(kubectl, namespace, replicas=1, gpusPerReplica=1, nodesPerReplica=2)
    eventually(lambda: all_ready(kubectl, namespace, 2), timeout=90, what="one ready group")
    kubectl("-n", namespace, "scale", "eagle3target", "llama", "--replicas=2")
    pods = eventually(lambda: all_ready(kubectl, namespace, 4), timeout=90, what="two ready groups")
    assert sorted(groups_of(pods)) == ["llama-0", "llama-1"]
    assert (
        kubectl.json("-n", namespace, "get", "e3t", "llama", "--subresource=scale")["status"]["replicas"] == 2
    )


def test_a_rollout_replaces_one_group_at_a_time(hollow_operator, kubectl, namespace):
    apply(kubectl, namespace, replicas=2, gpusPerReplica=8, nodesPerReplica=2)  # fills the four nodes
    eventually(lambda: all_ready(kubectl, namespace, 4), timeout=120, what="two ready groups of two")
    first = kubectl.json("-n", namespace, "get", "e3t", "llama")["status"]["revision"]
    apply(
        kubectl,
        namespace,
        replicas=2,
        gpusPerReplica=8,
        nodesPerReplica=2,
        args=["--max-batch-tokens", "4096"],
    )
    fewest = 2

    def rolled_out():
        nonlocal fewest
        pods = live_pods(kubectl, namespace)
        leaders = [p for p in pods if p["metadata"]["labels"][ROLE] == "leader" and ready(p)]
        fewest = min(fewest, len(leaders))
        status = kubectl.json("-n", namespace, "get", "e3t", "llama")["status"]
        revisions = {p["metadata"]["labels"]["eagle3.dev/revision"] for p in pods}
        done = status["revision"] != first and revisions == {status["revision"]} and len(pods) == 4
        return done and status.get("updatedReplicas") == 2 and status.get("readyReplicas") == 2

    eventually(rolled_out, timeout=180, interval=0.3, what="both groups at the new revision")
    assert fewest >= 1, "the rollout took both groups down at once"
