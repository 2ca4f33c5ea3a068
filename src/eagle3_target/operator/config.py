"""The operator's settings, fixed at startup (the CLI builds them; kopf's memo carries them to the handlers)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

IMAGE_REPOSITORY = "ghcr.io/eagle3-target/eagle3-target"
LEASE_NAME = "eagle3-target-operator"


def package_default_image() -> str:
    """The server image released together with this operator."""
    return f"{IMAGE_REPOSITORY}:{metadata.version('eagle3-target')}"


@dataclass(frozen=True)
class OperatorConfig:
    default_image: str = ""  # empty: package_default_image()
    interval: float = 10.0  # seconds between full re-checks of every target (events act sooner)
    stuck_pod_grace: float = 300.0  # seconds past its deletion deadline before a pod counts as abandoned
    cluster_domain: str = "cluster.local"  # the kubelet's clusterDomain: ends the DNS names trainers get
    leader_election: bool = False  # the CLI turns it on; in-process tests run one operator
    lease_namespace: str = ""  # empty: the namespace of the operator's own credentials
    lease_name: str = LEASE_NAME
    lease_duration: float = 15.0  # client-go's defaults: lease 15 s, renew deadline 10 s, retry 2 s
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    @property
    def image(self) -> str:
        return self.default_image or package_default_image()
