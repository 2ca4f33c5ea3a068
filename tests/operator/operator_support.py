"""What the kmock operator tests share: a target spec, condition lookup, ready pods."""

from __future__ import annotations

SPEC = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "replicas": 2,
    "gpusPerReplica": 1,
    "auxLayerIds": [1, 15, 28],
}


def condition(target: dict, type_: str) -> dict:
    for cond in target.get("status", {}).get("conditions", []):
        if cond["type"] == type_:
            return cond
    raise AssertionError(f"no {type_} condition yet")  # so that eventually() keeps polling


def ordinal_ip(pod: dict) -> str:
    return f"127.0.0.{int(pod['metadata']['labels']['eagle3.dev/ordinal']) + 2}"


async def ready_all(cluster, count: int, name: str = "llama", timeout: float = 15) -> dict[str, str]:
    """Wait for `count` pods, make them ready, wait for Ready=True; returns pod name -> uid."""
    pods = await cluster.eventually(lambda: len(cluster.pods()) == count and cluster.pods(), timeout)
    for pod_name, pod in pods.items():
        await cluster.set_pod_ready(pod_name, ordinal_ip(pod))
    await cluster.eventually(lambda: condition(cluster.target(name), "Ready")["status"] == "True", timeout)
    return {pod_name: pod["metadata"]["uid"] for pod_name, pod in cluster.pods().items()}
