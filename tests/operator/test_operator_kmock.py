"""The real operator against kmock: children, status, scaling, healing, rollout, invalid specs."""

from __future__ import annotations

SPEC = {"model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 2, "gpusPerReplica": 1, "auxLayerIds": [1, 15, 28]}


def condition(target: dict, type_: str) -> dict:
    return next(c for c in target.get("status", {}).get("conditions", []) if c["type"] == type_)


async def test_create_makes_pods_services_configmap_and_status(operator):
    created = await operator.create_target("llama", SPEC)
    uid = created["metadata"]["uid"]

    pods = await operator.eventually(lambda: len(operator.pods()) == 2 and operator.pods())
    assert sorted(pods) == ["llama-0", "llama-1"]
    for name, pod in pods.items():
        assert pod["metadata"]["ownerReferences"][0]["uid"] == uid
        assert pod["metadata"]["labels"]["eagle3.dev/target"] == "llama"
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert pod["spec"]["subdomain"] == "llama-peers"

    services = await operator.eventually(lambda: len(operator.services()) == 2 and operator.services())
    assert services["llama"]["spec"]["publishNotReadyAddresses"] is False
    assert services["llama-peers"]["spec"]["publishNotReadyAddresses"] is True
    assert all(s["metadata"]["ownerReferences"][0]["uid"] == uid for s in services.values())
    configmap = (await operator.eventually(lambda: operator.configmaps()))["llama-client"]
    assert configmap["data"]["EAGLE3_TARGET_SERVICE"] == f"srv://_http._tcp.llama.{operator.namespace}.svc.cluster.local"

    def starting():
        target = operator.target("llama")
        assert target.get("status", {}).get("replicas") == 2, target.get("status")
        assert condition(target, "Ready")["status"] == "False"
        return target

    target = await operator.eventually(starting)
    assert target["status"]["selector"] == "eagle3.dev/target=llama,app.kubernetes.io/component=target"
    assert target["status"]["observedGeneration"] == 1
    assert target["status"]["endpoints"] == []
    since = condition(target, "Ready")["lastTransitionTime"]

    await operator.set_pod_ready("llama-0", "127.0.0.2")
    await operator.eventually(lambda: operator.target("llama")["status"]["endpoints"] == ["127.0.0.2:8001"])
    assert condition(operator.target("llama"), "Ready")["lastTransitionTime"] == since  # still False: no move

    await operator.set_pod_ready("llama-1", "127.0.0.3")

    def ready():
        target = operator.target("llama")
        assert condition(target, "Ready") | {"lastTransitionTime": None} == {
            "type": "Ready", "status": "True", "reason": "AllTargetsReady", "message": "2/2 targets ready",
            "observedGeneration": 1, "lastTransitionTime": None,
        }  # fmt: skip
        return target

    target = await operator.eventually(ready)
    assert target["status"]["readyReplicas"] == 2
    assert target["status"]["endpoints"] == ["127.0.0.2:8001", "127.0.0.3:8001"]
    assert condition(target, "Progressing")["reason"] == "RolloutComplete"
    assert condition(target, "Degraded")["status"] == "False"
