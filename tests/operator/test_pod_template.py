"""Platform fields: spec.podTemplate merged into every pod (the operator's labels, ports and probes win),
gpuResourceName, hfTokenSecret, modelCache, shmSize, the cluster domain; pure builders, then the real operator
on kmock, whose harness prunes and defaults what it stores by the CRD's schema as an API server does."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest

from eagle3_target.operator import builders
from eagle3_target.operator.target_spec import InvalidSpec, TargetSpec

from .operator_support import SPEC

IMAGE = "registry.test/eagle3-target:test"
TEMPLATE = {
    "metadata": {
        "labels": {"team": "ml", "eagle3.dev/target": "hijacked", "app.kubernetes.io/component": "other"},
        "annotations": {"prometheus.io/scrape": "true"},
    },
    "spec": {
        "priorityClassName": "training-critical",
        "runtimeClassName": "nvidia",
        "schedulerName": "volcano",
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}
                    ]
                }
            }
        },
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
        ],
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        "volumes": [{"name": "rdma", "hostPath": {"path": "/dev/infiniband"}}],
        "containers": [
            {
                "name": "server",
                "env": [{"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}],
                "envFrom": [{"configMapRef": {"name": "nccl-tuning"}}],
                "volumeMounts": [{"name": "rdma", "mountPath": "/dev/infiniband"}],
                "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
            }
        ],
    },
}


def target(**spec) -> TargetSpec:
    return TargetSpec.parse({"model": "org/model", **spec})


def server(pod: dict) -> dict:
    (container,) = pod["spec"]["containers"]
    return container


def test_pod_template_is_merged_and_the_operators_fields_win():
    plain = builders.pod(
        target(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]), "llama", "ml", 1, IMAGE
    )
    spec = target(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}], podTemplate=TEMPLATE)
    pod = builders.pod(spec, "llama", "ml", 1, IMAGE)
    meta, pod_spec, container = pod["metadata"], pod["spec"], server(pod)

    assert meta["labels"]["team"] == "ml"
    assert builders.selector("llama").items() <= meta["labels"].items(), "the operator's labels win"
    assert meta["annotations"]["prometheus.io/scrape"] == "true"
    assert builders.HASH_ANNOTATION in meta["annotations"]
    for key in (
        "priorityClassName",
        "runtimeClassName",
        "schedulerName",
        "affinity",
        "topologySpreadConstraints",
    ):
        assert pod_spec[key] == TEMPLATE["spec"][key], key
    # the user's own tolerations first; the defaults only add the node-failure keys they leave out
    assert [t["key"] for t in pod_spec["tolerations"]] == [
        "nvidia.com/gpu",
        "dedicated",
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ]
    assert [v["name"] for v in pod_spec["volumes"]][-1] == "rdma"
    assert container["env"][-1] == {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}
    assert container["envFrom"] == [{"configMapRef": {"name": "nccl-tuning"}}]
    assert container["volumeMounts"][-1] == {"name": "rdma", "mountPath": "/dev/infiniband"}
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    plain_container = server(plain)
    for key in ("ports", "startupProbe", "readinessProbe", "livenessProbe", "command", "args", "image"):
        assert container[key] == plain_container[key], key
    kubernetes_validate.validate(pod, "1.33.0", strict=True)


def test_template_problems_are_named():
    problems = target(podTemplate={"spec": {"volumes": [{"name": "cache", "emptyDir": {}}]}}).problems()
    assert problems == ["podTemplate.spec.volumes: 'cache' is the operator's own volume"]
    problems = target(podTemplate={"spec": {"containers": [{"name": "sidecar"}]}}).problems()
    assert problems == ["podTemplate.spec.containers: 'sidecar' is not 'server'"]


@pytest.mark.parametrize(
    "template, where",
    [
        ("yes", "malformed spec"),
        ({"spec": {"volumes": [1]}}, "podTemplate.spec.volumes must be a list of objects"),
        ({"spec": {"containers": [{"name": "server", "env": "X=1"}]}}, "containers[].env must be a list"),
        (
            {
                "spec": {
                    "containers": [
                        {"name": "server", "securityContext": {"capabilities": {"add": "IPC_LOCK"}}}
                    ]
                }
            },
            "add must be a list",
        ),
        ({"metadata": []}, "podTemplate.metadata must be an object"),
        ({"metadata": {"labels": ["team=ml"]}}, "podTemplate.metadata.labels must be an object"),
    ],
)
def test_a_malformed_template_is_an_invalid_spec_not_a_crash(template, where):
    with pytest.raises(InvalidSpec, match=re.escape(where)):
        target(podTemplate=template)


def test_gpu_resource_name_counts_the_gpus():
    container = server(
        builders.pod(target(gpusPerReplica=2, gpuResourceName="amd.com/gpu"), "t", "ml", 0, IMAGE)
    )
    assert container["resources"]["limits"] == {"amd.com/gpu": 2}
    mig = server(builders.pod(target(gpuResourceName="nvidia.com/mig-3g.40gb"), "t", "ml", 0, IMAGE))
    assert mig["resources"]["limits"] == {"nvidia.com/mig-3g.40gb": 1}


def volumes_and_env(spec: TargetSpec) -> tuple[dict, dict, dict]:
    pod = builders.pod(spec, "t", "ml", 0, IMAGE)
    container = server(pod)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    return volumes, mounts, env


def test_model_cache_token_and_shared_memory():
    volumes, mounts, env = volumes_and_env(target())
    assert volumes["cache"] == {"name": "cache", "emptyDir": {"sizeLimit": "200Gi"}}
    assert volumes["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory"}}
    assert env["HF_HOME"].startswith(mounts["cache"] + "/") and env["HF_HUB_CACHE"].startswith(env["HF_HOME"])
    assert "HF_TOKEN" not in env

    volumes, mounts, env = volumes_and_env(
        target(
            modelCache={"persistentVolumeClaim": {"claimName": "hf-cache"}},
            hfTokenSecret={"name": "hf", "key": "hf_token"},
            shmSize="16Gi",
        )
    )
    assert volumes["cache"] == {"name": "cache", "persistentVolumeClaim": {"claimName": "hf-cache"}}
    assert env["HF_HOME"].startswith(mounts["cache"] + "/")
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "hf_token"}}
    assert volumes["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}
    assert volumes_and_env(target(modelCache={"sizeLimit": "50Gi"}))[0]["cache"]["emptyDir"] == {
        "sizeLimit": "50Gi"
    }


def test_the_server_binds_every_pod_address():
    pod = builders.pod(target(), "t", "ml", 0, IMAGE)
    args = server(pod)["args"]
    assert args[args.index("--host") + 1] == "$(POD_IPS)"
    env = {e["name"]: e for e in server(pod)["env"]}
    assert env["POD_IPS"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIPs"}}


def test_client_names_follow_the_cluster_domain():
    env = builders.client_env(target(), "llama", "ml", "k8s.internal")
    assert env["EAGLE3_TARGET_SERVICE"] == "srv://_http._tcp.llama.ml.svc.k8s.internal"
    assert env["EAGLE3_TARGET_SERVICE_DNS"] == "dns://llama.ml.svc.k8s.internal:8001"


# -- the real operator on kmock -------------------------------------------------------------------


async def test_stored_target_is_pruned_and_defaulted_and_the_template_reaches_pods(operator):
    template = {**TEMPLATE, "spec": {**TEMPLATE["spec"], "hostPID": True}}  # undeclared: pruned on the way in
    await operator.create_target(
        "llama", {**SPEC, "podTemplate": template, "bogus": 1, "hfTokenSecret": {"name": "hf"}}
    )
    stored = operator.target("llama")["spec"]
    assert "bogus" not in stored and "hostPID" not in stored["podTemplate"]["spec"]
    assert stored["gpuResourceName"] == "nvidia.com/gpu" and stored["modelCache"] == {"sizeLimit": "200Gi"}
    assert stored["hfTokenSecret"] == {"name": "hf", "key": "token"}
    assert stored["ports"]["nccl"] == {"start": 29600, "end": 29855, "perReplica": 8}

    pods = await operator.eventually(lambda: len(operator.pods()) == 2 and operator.pods())
    for pod in pods.values():
        assert "hostPID" not in pod["spec"]
        assert pod["spec"]["priorityClassName"] == "training-critical"
        assert pod["metadata"]["labels"]["team"] == "ml"
        assert pod["metadata"]["labels"]["eagle3.dev/target"] == "llama"
        env = {e["name"]: e for e in server(pod)["env"]}
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
        assert env["NCCL_SOCKET_IFNAME"]["value"] == "eth0"


async def test_a_template_volume_clash_is_reported_not_applied(operator):
    from .operator_support import condition

    clash = {"spec": {"volumes": [{"name": "dshm", "emptyDir": {}}]}}
    await operator.create_target("llama", {**SPEC, "podTemplate": clash})
    degraded = await operator.eventually(lambda: condition(operator.target("llama"), "Degraded"))
    assert "'dshm' is the operator's own volume" in degraded["message"]
    assert operator.pods() == {}


@pytest.mark.parametrize("domain", ["k8s.internal"])
async def test_the_operator_publishes_names_under_its_cluster_domain(cluster, start_operator, domain):
    await start_operator(cluster_domain=domain)
    await cluster.create_target("llama", SPEC)
    configmap = (await cluster.eventually(lambda: cluster.configmaps()))["llama-client"]
    assert (
        configmap["data"]["EAGLE3_TARGET_SERVICE"]
        == f"srv://_http._tcp.llama.{cluster.namespace}.svc.{domain}"
    )
