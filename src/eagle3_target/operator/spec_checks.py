"""What is wrong with an Eagle3Target's spec beyond its schema: the checks of ``TargetSpec.problems()``.

TargetSpec (target_spec.py) takes them as a base class, so a spec's fields and its checks are read in two
short modules. A spec may skip the API server's validation, so schema errors are checked here too.
"""

from __future__ import annotations

from eagle3_target.protocol.engines import engine, fleet_engines

SERVER_CONTAINER = "server"
# The volumes every target pod has; a podTemplate volume must not take one of their names.
OPERATOR_VOLUMES = frozenset({"tmp", "cache", "dshm", "model", "auth-token", "admin-token"})


def valid_int_or_percent(value: int | str) -> bool:
    if isinstance(value, int):
        return value >= 0
    return value.endswith("%") and value[:-1].isdigit()


class SpecChecks:
    """The semantic checks of TargetSpec, reading its fields (``self`` is a TargetSpec)."""

    def problems(self) -> list[str]:
        """Semantic errors the CRD schema cannot catch (and schema errors, since a spec may skip validation)."""
        errors = self._engine_problems()
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

    def _engine_problems(self) -> list[str]:
        if self.engine not in fleet_engines():
            return [f"engine {self.engine!r} is not one of {', '.join(fleet_engines())}"]
        if engine(self.engine).gpu_only and self.gpus_per_replica == 0:
            return [f"engine {self.engine} needs gpusPerReplica >= 1"]
        return []

    def _group_problems(self) -> list[str]:
        errors = []
        spans = [name for name in fleet_engines() if engine(name).nodes]
        if self.nodes_per_replica < 1:
            errors.append("nodesPerReplica must be at least 1")
        elif self.nodes_per_replica > 1 and self.engine in fleet_engines() and self.engine not in spans:
            errors.append(
                f"engine {self.engine} cannot span {self.nodes_per_replica} nodes (nodesPerReplica); use "
                f"one of {', '.join(spans)}"
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
            if not valid_int_or_percent(value)
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
