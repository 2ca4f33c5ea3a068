"""The chart rendered by the real helm 4 with several value sets, every object validated offline."""

from __future__ import annotations

import json

import jsonschema
import kubernetes_validate
import pytest
import yaml
from chart.render import (
    CHART,
    CI_VALUES,
    KUBE_VERSION,
    MONITORING_APIS,
    NAMESPACE,
    RELEASE,
    find,
    helm,
    one,
    template,
)
from crd_support import admit
from tools import REPO

from eagle3_target.operator import builders
from eagle3_target.operator.target_spec import TargetSpec

TARGET = RELEASE  # the Eagle3Target is named after the release's full name, which is the chart name here
CUSTOM_KINDS = {
    "Eagle3Target",
    "ServiceMonitor",
    "PodMonitor",
    "PrometheusRule",
}  # checked by their own schemas


@pytest.fixture(scope="module")
def renders(tools) -> dict[str, list[dict]]:
    """Every value set under ci/, rendered for a cluster that serves the Prometheus Operator's API."""
    return {
        name: template(tools, api_versions=MONITORING_APIS, values_file=path)
        for name, path in CI_VALUES.items()
    }


@pytest.fixture(scope="module")
def crd() -> dict:
    return yaml.safe_load((CHART / "crds" / "eagle3targets.yaml").read_text())


def crd_schema(crd: dict) -> dict:
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return version["schema"]["openAPIV3Schema"]


def undeclared_fields(value, schema: dict, path: str = "") -> list[str]:
    """Fields the API server would prune silently: not declared in a structural schema."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found = []
    if isinstance(value, dict) and "properties" in schema:
        for key, item in value.items():
            if key not in schema["properties"]:
                found.append(f"{path}.{key}")
            else:
                found += undeclared_fields(item, schema["properties"][key], f"{path}.{key}")
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, item in value.items():
            found += undeclared_fields(item, schema["additionalProperties"], f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found += undeclared_fields(item, schema["items"], f"{path}[{i}]")
    return found


def check_eagle3target(obj: dict, crd: dict) -> list[str]:
    schema = crd_schema(crd)
    problems = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(obj)
    ]
    return problems + [
        f"{p} is not in the CRD schema"
        for p in undeclared_fields(obj.get("spec", {}), schema["properties"]["spec"], "spec")
    ]


def test_ci_value_sets_cover_the_chart():
    assert {"defaults", "everything", "monitoring", "autoscaled", "host-network", "watch-namespaces"} <= set(
        CI_VALUES
    )


@pytest.mark.parametrize("name", sorted(CI_VALUES))
def test_lint_strict(tools, name):
    args = ["lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION, "--values", str(CI_VALUES[name])]
    result = helm(tools, *args, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_every_render_is_valid_kubernetes(renders):
    """kubernetes-validate --strict (in-process, one schema load per kind) on every core object of every render."""
    failures = []
    for render_name, objects in renders.items():
        for obj in objects:
            if obj["kind"] in CUSTOM_KINDS:
                continue
            try:
                kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                failures.append(f"{render_name}: {obj['kind']}/{obj['metadata']['name']}: {exc}")
    assert not failures, "\n".join(failures)


def test_kubernetes_validate_strict_rejects_an_unknown_field(renders):
    """The validation above has teeth: a misplaced field in a rendered Deployment fails it."""
    deployment = json.loads(json.dumps(one(renders["defaults"], "Deployment")))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)


def test_rendered_eagle3target_matches_the_crd_schema(renders, crd):
    for render_name, objects in renders.items():
        target = one(objects, "Eagle3Target")
        assert check_eagle3target(target, crd) == [], render_name


def test_crd_schema_check_catches_bad_and_unknown_fields(renders, crd):
    target = json.loads(json.dumps(one(renders["defaults"], "Eagle3Target")))
    target["spec"]["engine"] = "TGI"
    target["spec"]["ports"]["nccl"]["perRank"] = 4
    problems = check_eagle3target(target, crd)
    assert any("engine" in p and "TGI" in p for p in problems), problems
    assert "spec.ports.nccl.perRank is not in the CRD schema" in problems


def test_the_crd_in_the_chart_is_manifests_crd_byte_for_byte():
    assert (CHART / "crds" / "eagle3targets.yaml").read_bytes() == (
        REPO / "manifests" / "crd.yaml"
    ).read_bytes(), (
        "copy manifests/crd.yaml to charts/eagle3-target/crds/eagle3targets.yaml (manifests/ is the source of truth)"
    )


def test_defaults_install_crd_operator_and_a_gpu_fleet(renders):
    objects = renders["defaults"]
    crd = one(objects, "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "eagle3targets.eagle3.dev"
    deployment = one(objects, "Deployment", f"{RELEASE}-operator")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["eagle3-target"]
    assert container["args"] == [
        "--log-level=INFO",
        "operator",
        "--all-namespaces",
        "--liveness=http://0.0.0.0:8080/healthz",
        "--cluster-domain=cluster.local",
    ]
    assert {"name": "EAGLE3_TARGET_IMAGE", "value": "ghcr.io/eagle3-target/eagle3-target:0.1.0"} in container[
        "env"
    ]
    assert {"name": "EAGLE3_TARGET_OPERATOR_STUCK_POD_GRACE", "value": "300"} in container["env"]
    spec = one(objects, "Eagle3Target", TARGET)["spec"]
    assert spec["replicas"] == 1 and spec["gpusPerReplica"] == 1 and spec["hostNetwork"] is False
    assert spec["ports"] == {"http": 8001, "nccl": {"start": 29600, "end": 29855, "perReplica": 8}}
    assert spec["image"] == "ghcr.io/eagle3-target/eagle3-target:0.1.0"
    requests = container["resources"]["requests"]
    assert requests["cpu"] and requests["memory"], "the operator must be scheduled with requests"


def test_default_rendezvous_block_stays_clear_of_torchrun(renders):
    """torchrun's c10d store listens on 29500 (MASTER_PORT) and agents use the ports just above it."""
    torchrun = range(29500, 29511)
    for render_name, objects in renders.items():
        nccl = one(objects, "Eagle3Target")["spec"]["ports"]["nccl"]
        assert not set(torchrun) & set(range(nccl["start"], nccl["end"] + 1)), render_name


def test_null_replicas_leave_the_count_to_the_scaler(renders, crd):
    """An HPA or `kubectl scale` writes spec.replicas through /scale; Helm's server-side apply must not own it."""
    target = one(renders["autoscaled"], "Eagle3Target", TARGET)
    assert "replicas" not in target["spec"]
    assert check_eagle3target(target, crd) == []
    pod = one(renders["autoscaled"], "Pod")
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["TARGET_URLS"] == f"http://{TARGET}-0.{TARGET}-peers.{NAMESPACE}.svc.cluster.local:8001"


def test_values_reach_the_eagle3target(renders):
    spec = one(renders["everything"], "Eagle3Target", TARGET)["spec"]
    assert spec["replicas"] == 3 and spec["gpusPerReplica"] == 2
    assert spec["auxLayerIds"] == [2, 16, 29]
    assert spec["modelVolume"] == {"persistentVolumeClaim": {"claimName": "models"}, "subPath": "llama"}
    assert spec["authTokenSecret"] == {"name": "target-token"}
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert spec["serviceAccountName"] == "targets"
    assert spec["gpuResourceName"] == "amd.com/gpu" and spec["shmSize"] == "16Gi"
    assert spec["hfTokenSecret"] == {"name": "hf-token"}
    assert spec["generation"] == {"enabled": True, "maxTokens": 2048}
    assert spec["weights"] == {"source": "/models/llama-ft-2", "version": "ft-2"}
    assert one(renders["defaults"], "Eagle3Target", TARGET)["spec"]["generation"] == {"enabled": True}
    assert spec["modelCache"] == {"persistentVolumeClaim": {"claimName": "hf-cache"}, "sizeLimit": "200Gi"}
    assert spec["podTemplate"]["spec"]["containers"][0]["env"] == [
        {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}
    ]


def test_every_rendered_target_makes_valid_pods(renders, crd):
    """Rendered, stored as the API server would (pruned, defaulted), built by the operator: valid pods."""
    for render_name, objects in renders.items():
        stored = admit(crd_schema(crd), one(objects, "Eagle3Target"))
        spec = TargetSpec.parse(stored["spec"])
        assert spec.problems() == [], render_name
        pod = builders.pod(spec, stored["metadata"]["name"], NAMESPACE, 0, "img")
        kubernetes_validate.validate(pod, KUBE_VERSION, strict=True)
    spec = TargetSpec.parse(admit(crd_schema(crd), one(renders["everything"], "Eagle3Target"))["spec"])
    container = builders.pod(spec, TARGET, NAMESPACE, 0, "img")["spec"]["containers"][0]
    assert container["resources"]["limits"]["amd.com/gpu"] == 2
    assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert one(renders["host-network"], "Eagle3Target", TARGET)["spec"]["hostNetwork"] is True


def test_chart_owns_no_operator_children(renders):
    """Helm 4 applies server-side: the chart must not own what the operator writes (pods, Services, replicas)."""
    children = {builders.pod_name(TARGET, i) for i in range(8)} | {
        TARGET,
        builders.peers_service_name(TARGET),
        builders.client_configmap_name(TARGET),
    }
    for render_name, objects in renders.items():
        for obj in objects:
            if obj["kind"] in {"Pod", "Service", "ConfigMap", "StatefulSet", "ReplicaSet"}:
                assert obj["metadata"]["name"] not in children, (
                    render_name,
                    obj["kind"],
                    obj["metadata"]["name"],
                )
        assert not find(objects, "Service") and not find(objects, "StatefulSet"), render_name


def test_every_object_carries_the_recommended_labels(renders):
    for render_name, objects in renders.items():
        for obj in objects:
            if obj["kind"] == "CustomResourceDefinition":
                continue  # crds/ is not templated
            labels = obj["metadata"]["labels"]
            for key in (
                "app.kubernetes.io/name",
                "app.kubernetes.io/instance",
                "app.kubernetes.io/version",
                "app.kubernetes.io/managed-by",
                "app.kubernetes.io/part-of",
                "helm.sh/chart",
            ):
                assert key in labels, (render_name, obj["kind"], obj["metadata"]["name"], key)
            assert labels["app.kubernetes.io/instance"] == RELEASE


def pod_specs(objects: list[dict]) -> list[tuple[str, dict]]:
    specs = [(o["metadata"]["name"], o["spec"]) for o in objects if o["kind"] == "Pod"]
    return specs + [
        (o["metadata"]["name"], o["spec"]["template"]["spec"]) for o in objects if o["kind"] == "Deployment"
    ]


def test_chart_pods_run_restricted(renders):
    for render_name, objects in renders.items():
        for name, spec in pod_specs(objects):
            assert spec["securityContext"]["runAsNonRoot"] is True, name
            assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
            for container in spec["containers"]:
                sc = container["securityContext"]
                assert sc["allowPrivilegeEscalation"] is False, (render_name, name)
                assert sc["capabilities"] == {"drop": ["ALL"]}, (render_name, name)
                assert sc["readOnlyRootFilesystem"] is True, (render_name, name)
            assert not spec.get("hostNetwork"), name


def test_operator_off_renders_only_crd_and_fleet(renders):
    kinds = {o["kind"] for o in renders["operator-off"]}
    assert kinds == {"CustomResourceDefinition", "Eagle3Target", "Pod"}  # Pod: the helm test
    assert one(renders["operator-off"], "Pod")["metadata"]["annotations"]["helm.sh/hook"] == "test"


def test_operator_rbac_mirrors_manifests(renders):
    """Cluster-wide: exactly the ClusterRole of manifests/rbac.yaml. Watched namespaces: the same rules as Roles
    there and nothing cluster-wide (kopf's scanning is off). tests/cluster proves the rules are what the operator
    uses, no more and no less."""
    manifests = list(yaml.safe_load_all((REPO / "manifests" / "rbac.yaml").read_text()))
    reference = one(manifests, "ClusterRole", "eagle3-target-operator")["rules"]
    # namespaces: get only (is a target's namespace terminating?), never kopf's list and watch
    namespaces = [rule for rule in reference if "namespaces" in rule["resources"]]
    assert [rule["verbs"] for rule in namespaces] == [["get"]]
    cluster = renders["defaults"]
    assert one(cluster, "ClusterRole", f"{RELEASE}-operator")["rules"] == reference
    binding = one(cluster, "ClusterRoleBinding", f"{RELEASE}-operator")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": f"{RELEASE}-operator", "namespace": NAMESPACE}
    ]

    scoped = renders["watch-namespaces"]
    roles = [r for r in find(scoped, "Role") if r["metadata"]["name"] == f"{RELEASE}-operator"]
    assert {r["metadata"]["namespace"] for r in roles} == {"trainers", "research"}
    assert all(r["rules"] == reference for r in roles)
    bindings = [b for b in find(scoped, "RoleBinding") if b["metadata"]["name"] == f"{RELEASE}-operator"]
    assert {b["metadata"]["namespace"] for b in bindings} == {"trainers", "research"}

    # nodes (cluster-scoped, read-only): one ClusterRole, whatever it watches
    node_rules = one(manifests, "ClusterRole", "eagle3-target-operator-nodes")["rules"]
    assert node_rules == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]
    for render in (cluster, scoped):
        assert one(render, "ClusterRole", f"{RELEASE}-operator-nodes")["rules"] == node_rules

    # leader election: the Lease in the operator's own namespace, whatever it watches
    lease_role = one(manifests, "Role", "eagle3-target-operator-leader-election")
    for render in (cluster, scoped):
        role = one(render, "Role", f"{RELEASE}-operator-leader-election")
        assert role["rules"] == lease_role["rules"] and role["metadata"]["namespace"] == NAMESPACE
        binding = one(render, "RoleBinding", f"{RELEASE}-operator-leader-election")
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"][0]["name"] == f"{RELEASE}-operator"
    # nothing else cluster-wide: no namespaces, no CRDs
    assert [r["metadata"]["name"] for r in find(scoped, "ClusterRole")] == [f"{RELEASE}-operator-nodes"]


def test_pdb_and_network_policy_select_the_operators_pods(renders):
    objects = renders["pdb-network-policy"]
    pod_labels = builders.labels(TARGET)
    # the operator owns the budget (it builds the PodDisruptionBudget); the chart only sets its bounds
    assert find(objects, "PodDisruptionBudget") == []
    assert one(objects, "Eagle3Target")["spec"]["disruption"] == {"enabled": True}
    policy = one(objects, "NetworkPolicy", TARGET)
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    trainers, operator, metrics = policy["spec"]["ingress"]
    assert trainers["from"] == [{"podSelector": {"matchLabels": {"eagle3.dev/trainer": "true"}}}]
    # the operator refreshes weights in place over the HTTP port (spec.weights)
    deployment = one(objects, "Deployment")
    assert operator["from"] == [
        {"podSelector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]}}
    ]
    assert operator["ports"] == [{"protocol": "TCP", "port": "http"}]
    assert {"protocol": "TCP", "port": "http"} in trainers["ports"]
    assert {"protocol": "TCP", "port": 29600, "endPort": 29855} in trainers["ports"]
    assert metrics["ports"] == [{"protocol": "TCP", "port": "http"}]
    assert metrics["from"][0]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
    }
    test_pod = one(objects, "Pod")
    assert test_pod["metadata"]["labels"]["eagle3.dev/trainer"] == "true", (
        "helm test must get past the policy"
    )

    everything = renders["everything"]
    assert one(everything, "Eagle3Target")["spec"]["disruption"] == {"enabled": True, "minAvailable": 1}
    trainers, _ = one(everything, "NetworkPolicy")["spec"]["ingress"]  # no monitors: no metrics rule
    assert trainers["from"][0]["namespaceSelector"] == {"matchLabels": {"team": "ml"}}


def test_monitors_follow_the_operators_services_and_pods(renders):
    objects = renders["monitoring"]
    monitor = one(objects, "ServiceMonitor", TARGET)
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
        assert one(objects, kind, TARGET)["metadata"]["labels"]["release"] == "kube-prometheus-stack", kind
    assert monitor["spec"]["selector"]["matchLabels"].items() <= builders.labels(TARGET).items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics" and endpoint["honorLabels"] is True
    (keep,) = endpoint["relabelings"]
    assert keep["action"] == "keep" and keep["regex"] == builders.peers_service_name(TARGET)
    pod_monitor = one(objects, "PodMonitor", TARGET)
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= builders.labels(TARGET).items()
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "http"


def test_monitors_need_the_monitoring_api(tools):
    objects = template(tools, values_file=CI_VALUES["monitoring"])
    assert not find(objects, "ServiceMonitor") and not find(objects, "PodMonitor")
    assert not find(objects, "PrometheusRule")
    assert find(objects, "ConfigMap"), "the dashboard ConfigMap needs no Prometheus Operator"


def test_dashboard_configmap_carries_the_repo_dashboard(renders):
    configmap = one(renders["monitoring"], "ConfigMap", f"{RELEASE}-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(configmap["data"]["eagle3-target.json"])
    assert shipped == json.loads((CHART / "dashboards" / "eagle3-target.json").read_text())
    assert not find(renders["defaults"], "ConfigMap"), "the dashboard is opt-in"


def test_helm_test_pod_reaches_every_replica_through_the_services(renders):
    pod = one(renders["defaults"], "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    fqdn = f"{TARGET}.{NAMESPACE}.svc.cluster.local"
    assert env["SERVICE_URL"] == f"http://{fqdn}:8001"
    assert env["TARGET_URLS"] == f"http://{TARGET}-0.{TARGET}-peers.{NAMESPACE}.svc.cluster.local:8001"
    assert pod["spec"]["containers"][0]["args"][0] == (CHART / "files" / "check_fleet.py").read_text()

    host = one(renders["host-network"], "Pod")
    env = {e["name"]: e["value"] for e in host["spec"]["containers"][0]["env"]}
    assert "SERVICE_URL" not in env, "with hostNetwork the replicas do not share one port"
    assert env["TARGET_URLS"].split() == [
        f"http://{TARGET}-{i}.{TARGET}-peers.{NAMESPACE}.svc.cluster.local:{8001 + i}" for i in range(4)
    ]
    assert pod["spec"]["containers"][0]["image"] == "docker.io/library/python:3.13-alpine", (
        "not the server image"
    )
    everything = one(renders["everything"], "Pod")["spec"]
    fqdn = f"{TARGET}.{NAMESPACE}.svc.k8s.example.internal"
    env = {e["name"]: e["value"] for e in everything["containers"][0]["env"]}
    assert env["SERVICE_URL"] == f"http://{fqdn}:8001", "clusterDomain names the Services"
    assert everything["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert everything["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_the_operator_cli_accepts_the_rendered_arguments(renders, monkeypatch):
    from eagle3_target import cli
    from eagle3_target.operator import cli as operator_cli

    parsed = []
    monkeypatch.setattr(operator_cli, "run", lambda args: parsed.append(args) or 0)
    for render_name in ("defaults", "watch-namespaces"):
        container = one(renders[render_name], "Deployment")["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] == ["eagle3-target"]
        assert cli.main(container["args"]) == 0, render_name
    cluster_wide, scoped = parsed
    assert cluster_wide.all_namespaces and not cluster_wide.namespace
    assert scoped.namespace == ["trainers", "research"]
    assert cluster_wide.liveness == "http://0.0.0.0:8080/healthz"
    assert cluster_wide.cluster_domain == "cluster.local"


def test_nodes_per_replica_passes_through_only_when_set(tools, crd):
    grouped = one(
        template(tools, {"target.nodesPerReplica": "2", "target.groupScheduleTimeoutSeconds": "900"}),
        "Eagle3Target",
    )
    assert grouped["spec"]["nodesPerReplica"] == 2 and grouped["spec"]["groupScheduleTimeoutSeconds"] == 900
    assert check_eagle3target(grouped, crd) == []
    plain = one(template(tools), "Eagle3Target")["spec"]
    assert "nodesPerReplica" not in plain and "groupScheduleTimeoutSeconds" not in plain
