"""An Eagle3Target's spec as typed values with the CRD's defaults, its per-replica port layout, and the
semantic checks a schema cannot express."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eagle3_target.protocol.contract import DEFAULT_PORT

from .disruption import Disruption
from .generation import Generation
from .spec_checks import SpecChecks, valid_int_or_percent
from .weights import Weights

# Fields that steer how pods change over, not what a pod is: they stay out of the revision hash.
ROLLOUT_FIELDS = frozenset(
    {
        "replicas",
        "max_surge",
        "max_unavailable",
        "partition",
        "progress_deadline_seconds",
        "disruption",
        "group_schedule_timeout_seconds",
        "weights",  # refreshed in place (weights.py), never by replacing pods
    }
)


class InvalidSpec(ValueError):
    """The spec cannot be reconciled; the message says why."""


@dataclass(frozen=True)
class ProbeTiming:
    period_seconds: int
    failure_threshold: int
    timeout_seconds: int

    @classmethod
    def parse(cls, raw: dict[str, Any] | None, failure_threshold: int) -> ProbeTiming:
        raw = raw or {}
        return cls(
            period_seconds=int(raw.get("periodSeconds", 10)),
            failure_threshold=int(raw.get("failureThreshold", failure_threshold)),
            timeout_seconds=int(raw.get("timeoutSeconds", 5)),
        )


@dataclass(frozen=True)
class PortLayout:
    """The ports one replica listens on."""

    http: int
    nccl_start: int
    nccl_end: int  # inclusive

    @property
    def nccl_ports(self) -> range:
        return range(self.nccl_start, self.nccl_end + 1)

    @property
    def nccl_range(self) -> str:
        return f"{self.nccl_start}-{self.nccl_end}"


@dataclass(frozen=True)
class TargetSpec(SpecChecks):
    """Defaults here mirror the CRD's schema defaults (tests compare them), so a spec that skipped API-server
    defaulting reconciles the same way; ``problems()`` (spec_checks.py) says what is wrong with one."""

    model: str
    engine: str = "hf"
    dtype: str = "auto"
    aux_layer_ids: tuple[int, ...] | None = None
    replicas: int = 1
    gpus_per_replica: int = 1
    image: str = ""
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[dict, ...] = ()
    args: tuple[str, ...] = ()
    resources: dict = field(default_factory=dict)
    env: tuple[dict, ...] = ()
    node_selector: dict = field(default_factory=dict)
    tolerations: tuple[dict, ...] = ()
    affinity: dict = field(default_factory=dict)
    host_network: bool = False
    http_port: int = DEFAULT_PORT
    nccl_start: int = 29600  # clear of torchrun's 29500-29510
    nccl_end: int = 29855
    nccl_per_replica: int = 8
    startup_probe: ProbeTiming = ProbeTiming(10, 180, 5)
    readiness_probe: ProbeTiming = ProbeTiming(10, 3, 5)
    liveness_probe: ProbeTiming = ProbeTiming(10, 6, 5)
    model_volume: dict | None = None
    auth_secret_name: str | None = None
    auth_secret_key: str = "token"
    service_account_name: str | None = None
    max_surge: int | str = 0  # GPUs are scarce: no extra pod during a rollout unless asked
    max_unavailable: int | str = 1
    partition: int = 0
    progress_deadline_seconds: int = 1800  # model loads are slow
    gpu_resource_name: str = "nvidia.com/gpu"
    hf_token_secret: tuple[str, str] | None = None  # (name, key)
    model_cache_claim: str | None = None
    model_cache_size_limit: str = "200Gi"
    shm_size: str | None = None
    pod_template: dict = field(default_factory=dict)
    disruption: Disruption = Disruption()
    node_failure_tolerance_seconds: int = 60  # a replica is cheap to move and slow to wait for
    tolerate_gpu_taint: bool = True
    nodes_per_replica: int = (
        1  # K > 1: each replica is a group of K pods on K nodes (one leader, K-1 workers)
    )
    group_schedule_timeout_seconds: int = 600
    generation: Generation = Generation()
    weights: Weights | None = None

    @classmethod
    def parse(cls, spec: dict[str, Any]) -> TargetSpec:
        """Typed spec with defaults; raises InvalidSpec on missing or mistyped fields."""
        try:
            return cls._parse(spec)
        except InvalidSpec:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise InvalidSpec(f"malformed spec: {type(e).__name__}: {e}") from None

    @classmethod
    def _parse(cls, spec: dict[str, Any]) -> TargetSpec:
        model = spec["model"]
        if not isinstance(model, str) or not model:
            raise InvalidSpec("spec.model must be a non-empty string")
        ports = spec.get("ports") or {}
        nccl = ports.get("nccl") or {}
        probes = spec.get("probes") or {}
        secret = spec.get("authTokenSecret")
        strategy = spec.get("updateStrategy") or {}
        hf_token = spec.get("hfTokenSecret")
        cache = spec.get("modelCache") or {}
        aux = spec.get("auxLayerIds")
        return cls(
            model=model,
            engine=spec.get("engine", "hf"),
            dtype=spec.get("dtype", "auto"),
            aux_layer_ids=tuple(int(i) for i in aux) if aux is not None else None,
            replicas=int(spec.get("replicas", 1)),
            gpus_per_replica=int(spec.get("gpusPerReplica", 1)),
            image=spec.get("image") or "",
            image_pull_policy=spec.get("imagePullPolicy", "IfNotPresent"),
            image_pull_secrets=tuple(dict(s) for s in spec.get("imagePullSecrets") or ()),
            args=tuple(str(a) for a in spec.get("args") or ()),
            resources=dict(spec.get("resources") or {}),
            env=tuple(dict(e) for e in spec.get("env") or ()),
            node_selector=dict(spec.get("nodeSelector") or {}),
            tolerations=tuple(dict(t) for t in spec.get("tolerations") or ()),
            affinity=dict(spec.get("affinity") or {}),
            host_network=bool(spec.get("hostNetwork", False)),
            http_port=int(ports.get("http", DEFAULT_PORT)),
            nccl_start=int(nccl.get("start", 29600)),
            nccl_end=int(nccl.get("end", 29855)),
            nccl_per_replica=int(nccl.get("perReplica", 8)),
            startup_probe=ProbeTiming.parse(probes.get("startup"), 180),
            readiness_probe=ProbeTiming.parse(probes.get("readiness"), 3),
            liveness_probe=ProbeTiming.parse(probes.get("liveness"), 6),
            model_volume=dict(spec["modelVolume"]) if spec.get("modelVolume") else None,
            auth_secret_name=secret["name"] if secret else None,
            auth_secret_key=(secret or {}).get("key", "token"),
            service_account_name=spec.get("serviceAccountName") or None,
            max_surge=_int_or_percent(strategy.get("maxSurge", 0)),
            max_unavailable=_int_or_percent(strategy.get("maxUnavailable", 1)),
            partition=int(strategy.get("partition", 0)),
            progress_deadline_seconds=int(spec.get("progressDeadlineSeconds", 1800)),
            gpu_resource_name=str(spec.get("gpuResourceName", "nvidia.com/gpu")),
            hf_token_secret=(hf_token["name"], hf_token.get("key", "token")) if hf_token else None,
            model_cache_claim=(cache.get("persistentVolumeClaim") or {}).get("claimName"),
            model_cache_size_limit=str(cache.get("sizeLimit", "200Gi")),
            shm_size=str(spec["shmSize"]) if spec.get("shmSize") else None,
            pod_template=_pod_template(spec.get("podTemplate") or {}),
            disruption=Disruption.parse(spec.get("disruption")),
            node_failure_tolerance_seconds=int(spec.get("nodeFailureToleranceSeconds", 60)),
            tolerate_gpu_taint=bool(spec.get("tolerateGpuTaint", True)),
            nodes_per_replica=int(spec.get("nodesPerReplica", 1)),
            group_schedule_timeout_seconds=int(spec.get("groupScheduleTimeoutSeconds", 600)),
            generation=Generation.parse(spec.get("generation")),
            weights=Weights.parse(spec.get("weights")),
        )

    def surge_and_unavailable(self) -> tuple[int, int]:
        """Deployment's arithmetic: a percentage of replicas, surge rounded up, unavailable rounded down."""
        return (
            _scaled(self.max_surge, self.replicas, round_up=True),
            _scaled(self.max_unavailable, self.replicas, round_up=False),
        )

    def ports_for(self, ordinal: int) -> PortLayout:
        """With hostNetwork each replica owns HTTP port http+ordinal and the ordinal-th NCCL block, so several
        replicas can share a node; on the pod network every replica uses the same ports on its own IP."""
        slot = ordinal if self.host_network else 0
        start = self.nccl_start + slot * self.nccl_per_replica
        return PortLayout(
            http=self.http_port + slot, nccl_start=start, nccl_end=start + self.nccl_per_replica - 1
        )


def _objects(value: Any, where: str) -> list:
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise TypeError(f"{where} must be a list of objects")
    return value


def _pod_template(raw: Any) -> dict:
    """podTemplate as given, once its shape is what the builders merge (the schema says the same; a spec that
    skipped validation gets an InvalidSpec instead of a failed reconcile)."""
    template = dict(raw)
    for part in ("metadata", "spec"):
        if not isinstance(template.get(part, {}), dict):
            raise TypeError(f"podTemplate.{part} must be an object")
    for key in ("labels", "annotations"):
        if not isinstance((template.get("metadata") or {}).get(key, {}), dict):
            raise TypeError(f"podTemplate.metadata.{key} must be an object")
    spec = template.get("spec") or {}
    for key in ("tolerations", "topologySpreadConstraints", "volumes", "containers"):
        _objects(spec.get(key) or [], f"podTemplate.spec.{key}")
    for container in spec.get("containers") or ():
        for key in ("env", "envFrom", "volumeMounts"):
            _objects(container.get(key) or [], f"podTemplate.spec.containers[].{key}")
        added = ((container.get("securityContext") or {}).get("capabilities") or {}).get("add") or []
        if not isinstance(added, list):
            raise TypeError("podTemplate.spec.containers[].securityContext.capabilities.add must be a list")
    return template


def _int_or_percent(value: Any) -> int | str:
    return value if isinstance(value, int | str) and not isinstance(value, bool) else str(value)


def _scaled(value: int | str, replicas: int, *, round_up: bool) -> int:
    if isinstance(value, int):
        return value
    if not valid_int_or_percent(value):
        return 0
    share = int(value[:-1]) * replicas
    return -(-share // 100) if round_up else share // 100
