"""The real operator against kmock: the default one-at-a-time rollout, hostNetwork ports, the CLI process, leader
election through an outage. Creation, scaling, healing, surge and partition rollouts, an invalid spec, two
operators and a killed leader run on a real API server in tests/cluster."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys

import aiohttp

from .operator_support import SPEC, condition


async def _ready_all(operator, count: int) -> None:
    pods = await operator.eventually(lambda: len(operator.pods()) == count and operator.pods())
    for name in pods:
        await operator.set_pod_ready(name, f"127.0.0.{int(name.rsplit('-', 1)[1]) + 2}")
    await operator.eventually(
        lambda: operator.target("llama").get("status", {}).get("readyReplicas") == count
    )


async def test_spec_change_replaces_pods_one_at_a_time(operator):
    await operator.create_target("llama", SPEC)
    await _ready_all(operator, 2)
    uids = {name: pod["metadata"]["uid"] for name, pod in operator.pods().items()}

    await operator.patch_target("llama", {"spec": {"dtype": "bfloat16"}})

    def first_replaced():  # the highest ordinal goes first; the other keeps serving meanwhile
        pods = operator.pods()
        assert "llama-1" in pods and pods["llama-1"]["metadata"]["uid"] != uids["llama-1"]
        return pods

    pods = await operator.eventually(first_replaced)
    assert "bfloat16" in pods["llama-1"]["spec"]["containers"][0]["args"]
    await operator.eventually(
        lambda: condition(operator.target("llama"), "Progressing")["reason"] == "RollingUpdate"
    )

    await asyncio.sleep(1.0)  # five timer ticks: llama-0 must wait for llama-1 to become ready
    assert operator.pods()["llama-0"]["metadata"]["uid"] == uids["llama-0"]

    await operator.set_pod_ready("llama-1", "127.0.0.3")

    def second_replaced():
        pod = operator.pods().get("llama-0")
        assert pod is not None and pod["metadata"]["uid"] != uids["llama-0"]
        return pod

    assert "bfloat16" in (await operator.eventually(second_replaced))["spec"]["containers"][0]["args"]
    await operator.set_pod_ready("llama-0", "127.0.0.2")

    def complete():
        target = operator.target("llama")
        assert condition(target, "Progressing")["reason"] == "RolloutComplete"
        assert condition(target, "Ready")["status"] == "True" and target["status"]["observedGeneration"] == 2
        return target

    await operator.eventually(complete)


async def test_host_network_ports_per_replica_and_too_small_range(operator):
    spec = {
        **SPEC,
        "hostNetwork": True,
        "ports": {"http": 9000, "nccl": {"start": 30000, "end": 30015, "perReplica": 8}},
    }
    await operator.create_target("llama", spec)
    pods = await operator.eventually(lambda: len(operator.pods()) == 2 and operator.pods())
    for ordinal in (0, 1):
        pod = pods[f"llama-{ordinal}"]
        assert pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
        ports = {
            p["name"]: (p["containerPort"], p["hostPort"]) for p in pod["spec"]["containers"][0]["ports"]
        }
        assert ports["http"] == (9000 + ordinal, 9000 + ordinal)
        assert ports["nccl"] == (30000 + 8 * ordinal,) * 2 and len(ports) == 9

    await operator.patch_target("llama", {"spec": {"replicas": 3}})  # 3 x 8 ports > 16
    await operator.eventually(
        lambda: condition(operator.target("llama"), "Degraded")["reason"] == "InvalidSpec"
    )
    assert "too small" in condition(operator.target("llama"), "Degraded")["message"]
    await asyncio.sleep(0.5)
    assert sorted(operator.pods()) == ["llama-0", "llama-1"]


async def test_target_created_invalid_gets_no_children(operator):
    await operator.create_target("broken", {**SPEC, "auxLayerIds": [4, 4, 4]})
    await operator.eventually(
        lambda: condition(operator.target("broken"), "Degraded")["reason"] == "InvalidSpec"
    )
    assert operator.target("broken")["status"]["replicas"] == 0
    assert operator.pods() == {} and operator.services() == {} and operator.configmaps() == {}


async def test_cli_runs_the_operator_with_liveness_and_stops_on_sigterm(cluster):
    """`eagle3-target operator` as a process: it reconciles, serves kopf's liveness probe, exits cleanly."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "EAGLE3_TARGET_OPERATOR_INTERVAL": "0.2"}
    # -A: with -n, kopf also watches namespaces, and kmock cannot list the cluster-scoped /api/v1/namespaces
    args = [
        "-m",
        "eagle3_target.cli",
        "operator",
        "-A",
        "--liveness",
        f"http://127.0.0.1:{port}/healthz",
        "--default-image",
        "registry.test/cli:1",
    ]
    proc = await asyncio.create_subprocess_exec(sys.executable, *args, env=env)
    try:
        await cluster.create_target("llama", {**SPEC, "replicas": 1})
        pod = await cluster.eventually(lambda: cluster.pods().get("llama-0"), timeout=30)
        assert pod["spec"]["containers"][0]["image"] == "registry.test/cli:1"
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/healthz") as resp:
            assert resp.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)
    assert code == 0


async def test_a_crashed_leaders_lease_expires_and_exactly_one_candidate_takes_it(cluster):
    """No release (the leader's process died): the Lease is taken over only after a whole lease duration
    without renewal, by one candidate of two, and the old leader stops acting once it cannot renew."""
    import kr8s.asyncio

    from eagle3_target.operator.config import OperatorConfig
    from eagle3_target.operator.leader import LeaseElector

    config = OperatorConfig(leader_election=True, lease_duration=1, renew_deadline=0.6, retry_period=0.1)
    api = await kr8s.asyncio.api(kubeconfig=os.environ["KUBECONFIG"])
    first = LeaseElector(api, config, cluster.namespace)
    candidates = [LeaseElector(api, config, cluster.namespace) for _ in range(2)]
    tasks = [asyncio.create_task(first.run())]
    try:
        await cluster.eventually(lambda: first.is_leader)
        tasks += [asyncio.create_task(c.run()) for c in candidates]
        await asyncio.sleep(1.5)  # renewed all along: nobody else gets it
        assert first.is_leader and not any(c.is_leader for c in candidates)
        cluster.kube.outages.add("coordination.k8s.io/v1/leases")  # nobody can renew or acquire
        await cluster.eventually(lambda: not first.is_leader, timeout=5)  # the leader stops acting
        assert not any(c.is_leader for c in candidates)
        cluster.kube.outages.clear()
        await cluster.eventually(lambda: first.is_leader, timeout=5)  # its own lease: renewed at once
        tasks[0].cancel()  # the leader's process dies without releasing
        taken = asyncio.get_running_loop().time()
        await cluster.eventually(lambda: any(c.is_leader for c in candidates), timeout=10)
        assert asyncio.get_running_loop().time() - taken >= 0.9  # not before the lease expired
        await asyncio.sleep(0.5)
        assert sum(c.is_leader for c in candidates) == 1
        lease = cluster.leases()["eagle3-target-operator"]["spec"]
        assert lease["holderIdentity"] in {c.identity for c in candidates} and lease["leaseTransitions"] == 1
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
