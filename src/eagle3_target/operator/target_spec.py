"""An Eagle3Target's spec as typed values with the CRD's defaults, its per-replica port layout, and the
semantic checks a schema cannot express."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eagle3_target.protocol.contract import DEFAULT_PORT

from .disruption import Disruption
from .generation import Generation
from .template import SERVER_CONTAINER
from .template import parse as _pod_template
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
ENGINES = ("hf", "sglang", "vllm")
# Every engine's `serve` splits a replica over its pod's GPUs (--tensor-parallel-size); these span nodes too.
MULTI_NODE_ENGINES = ("hf", "vllm")


# The volumes every target pod has; a podTemplate volume must not take one of their names.
OPERATOR_VOLUMES = frozenset({"tmp", "cache", "dshm", "model", "auth-token", "admin-token"})


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
class TargetSpec:
    """Defaults here mirror the CRD's schema defaults (tests compare them), so a spec that skipped API-server
    defaulting reconciles the same way."""

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
    # K > 1: each replica is a group of K pods on K nodes (one leader, K-1 workers)
    nodes_per_replica: int = 1
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

    def problems(self) -> list[str]:
        """Semantic errors the CRD schema cannot catch (and schema errors, since a spec may skip validation)."""
        errors = []
        if self.engine not in ENGINES:
            errors.append(f"engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        if self.engine == "sglang" and self.gpus_per_replica == 0:
            errors.append("engine sglang needs gpusPerReplica >= 1")
        if self.replicas < 0:
            errors.append("replicas must not be negative")
        if self.gpus_per_replica < 0:
            errors.append("gpusPerReplica must not be negative")
        if self.node_failure_tolerance_seconds < 0:
            errors.append("nodeFailureToleranceSeconds must not be negative")
        errors += self.disruption.problems(self.replicas) + self.generation.problems()
        errors += self.weights.problems() if self.weights else []
        errors += self._group_problems()
        if self.aux_layer_ids is not None:
            if len(self.aux_layer_ids) != 3:
                errors.append(f"auxLayerIds needs three layer ids, got {len(self.aux_layer_ids)}")
            if len(set(self.aux_layer_ids)) != len(self.aux_layer_ids):
                errors.append(f"auxLayerIds has duplicates: {list(self.aux_layer_ids)}")
            if any(i < 0 for i in self.aux_layer_ids):
                errors.append("auxLayerIds must not be negative")
        errors += self._port_problems()
        errors += self._strategy_problems()
        if self.model_volume is not None:
            sources = [k for k in ("persistentVolumeClaim", "volumeSource") if self.model_volume.get(k)]
            if len(sources) != 1:
                errors.append("modelVolume needs exactly one of persistentVolumeClaim and volumeSource")
        return errors + self._template_problems()

    def _group_problems(self) -> list[str]:
        errors = []
        if self.nodes_per_replica < 1:
            errors.append("nodesPerReplica must be at least 1")
        elif self.nodes_per_replica > 1 and self.engine not in MULTI_NODE_ENGINES:
            errors.append(
                f"engine {self.engine} cannot span {self.nodes_per_replica} nodes (nodesPerReplica); use "
                f"one of {', '.join(MULTI_NODE_ENGINES)}"
            )
        if self.nodes_per_replica > 1 and self.surge_and_unavailable()[0] > 0:
            errors.append(
                "updateStrategy.maxSurge must be 0 with nodesPerReplica > 1: a surge group's leader would share "
                "the DNS name its workers meet at with the leader of the group it replaces"
            )
        if self.group_schedule_timeout_seconds < 1:
            errors.append("groupScheduleTimeoutSeconds must be at least 1")
        return errors

    def _template_problems(self) -> list[str]:
        spec = self.pod_template.get("spec") or {}
        clashes = [v.get("name") for v in spec.get("volumes") or () if v.get("name") in OPERATOR_VOLUMES]
        errors = [f"podTemplate.spec.volumes: {name!r} is the operator's own volume" for name in clashes]
        others = [c.get("name") for c in spec.get("containers") or () if c.get("name") != SERVER_CONTAINER]
        errors += [f"podTemplate.spec.containers: {name!r} is not {SERVER_CONTAINER!r}" for name in others]
        return errors

    def _strategy_problems(self) -> list[str]:
        errors = [
            f"updateStrategy.{key} {value!r} is neither a non-negative integer nor a percentage like '25%'"
            for key, value in (("maxSurge", self.max_surge), ("maxUnavailable", self.max_unavailable))
            if not _valid_int_or_percent(value)
        ]
        if not errors and self.surge_and_unavailable() == (0, 0) and self.replicas > 0:
            errors.append(
                "updateStrategy: maxSurge and maxUnavailable must not both be 0 (no rollout could start)"
            )
        if self.partition < 0:
            errors.append("updateStrategy.partition must not be negative")
        if self.progress_deadline_seconds < 1:
            errors.append("progressDeadlineSeconds must be at least 1")
        return errors

    def _port_problems(self) -> list[str]:
        if self.nccl_per_replica < 1:
            return ["ports.nccl.perReplica must be at least 1"]
        if self.nccl_end < self.nccl_start:
            return [f"ports.nccl.end {self.nccl_end} is below ports.nccl.start {self.nccl_start}"]
        errors = []
        size = self.nccl_end - self.nccl_start + 1
        slots = max(self.replicas, 1) if self.host_network else 1
        if slots * self.nccl_per_replica > size:
            errors.append(
                f"NCCL port range {self.nccl_start}-{self.nccl_end} ({size} ports) is too small for "
                f"{slots} replica(s) x {self.nccl_per_replica} ports"
            )
        last = self.ports_for(slots - 1)
        if last.http > 65535 or last.nccl_end > 65535:
            errors.append(f"ports of replica {slots - 1} pass 65535")
        if self.http_port <= self.nccl_end and self.nccl_start <= last.http:
            errors.append(
                f"HTTP ports {self.http_port}-{last.http} overlap the NCCL range {self.nccl_start}-{self.nccl_end}"
            )
        return errors


def _int_or_percent(value: Any) -> int | str:
    return value if isinstance(value, int | str) and not isinstance(value, bool) else str(value)


def _valid_int_or_percent(value: int | str) -> bool:
    if isinstance(value, int):
        return value >= 0
    return value.endswith("%") and value[:-1].isdigit()


def _scaled(value: int | str, replicas: int, *, round_up: bool) -> int:
    if isinstance(value, int):
        return value
    if not _valid_int_or_percent(value):
        return 0
    share = int(value[:-1]) * replicas
    return -(-share // 100) if round_up else share // 100
