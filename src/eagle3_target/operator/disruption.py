"""A target's PodDisruptionBudget: how many of its replicas a drain may take at once (`spec.disruption`), and
whether that budget lets any drain through at all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_UNAVAILABLE = 1


@dataclass(frozen=True)
class Disruption:
    """`spec.disruption`: on by default with maxUnavailable 1; `enabled: false` removes the budget."""

    enabled: bool = True
    max_unavailable: int | None = None
    min_available: int | None = None

    @classmethod
    def parse(cls, raw: dict[str, Any] | None) -> Disruption:
        raw = raw or {}
        max_unavailable, min_available = raw.get("maxUnavailable"), raw.get("minAvailable")
        return cls(
            enabled=bool(raw.get("enabled", True)),
            max_unavailable=int(max_unavailable) if max_unavailable is not None else None,
            min_available=int(min_available) if min_available is not None else None,
        )

    def problems(self, replicas: int) -> list[str]:
        """The CRD's rules, for a spec that skipped validation."""
        errors = []
        if self.max_unavailable is not None and self.min_available is not None:
            errors.append("disruption: set maxUnavailable or minAvailable, not both")
        for key, value in (("maxUnavailable", self.max_unavailable), ("minAvailable", self.min_available)):
            if value is not None and value < 0:
                errors.append(f"disruption.{key} must not be negative")
        bound = self.max_unavailable
        if bound is not None and bound >= 0 and replicas > 0 and bound > replicas:
            errors.append(f"disruption.maxUnavailable {bound} is larger than replicas {replicas}")
        return errors

    def budget(self) -> dict[str, int]:
        """The PodDisruptionBudget's one bound."""
        if self.min_available is not None:
            return {"minAvailable": self.min_available}
        bound = self.max_unavailable if self.max_unavailable is not None else DEFAULT_MAX_UNAVAILABLE
        return {"maxUnavailable": bound}

    def blocks_drains(self, replicas: int) -> bool:
        """No eviction can ever pass: a drain of any node holding one of these pods waits forever."""
        if not self.enabled or replicas == 0:
            return False
        budget = self.budget()
        if "minAvailable" in budget:
            return budget["minAvailable"] >= replicas
        return budget["maxUnavailable"] == 0


def pod_disruption_budget(
    disruption: Disruption, name: str, namespace: str, labels: dict, selector: dict
) -> dict:
    """Counts ready pods against the bound; `AlwaysAllow` lets a drain evict a pod that is not ready anyway
    (a crash-looping or still-loading replica must not hold a node hostage)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            **disruption.budget(),
            "selector": {"matchLabels": selector},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def switch_bound(body: dict) -> dict:
    """A merge patch to `body` that also removes the other bound (the API refuses a budget with both)."""
    spec = body["spec"]
    other = "minAvailable" if "maxUnavailable" in spec else "maxUnavailable"
    return {**body, "spec": {**spec, other: None}}


def drains_blocked(target) -> str:
    """The DrainsBlocked condition's message for a TargetSpec whose budget allows no eviction; "" otherwise."""
    if target is None or not target.disruption.blocks_drains(target.replicas):
        return ""
    bound = ", ".join(f"{k} {v}" for k, v in target.disruption.budget().items())
    return (
        f"the PodDisruptionBudget ({bound}) allows no eviction with {target.replicas} replica(s): a drain of "
        "a node holding one of these pods waits until spec.disruption or spec.replicas changes"
    )
