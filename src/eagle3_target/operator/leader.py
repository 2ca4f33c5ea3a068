"""Leader election over a coordination.k8s.io/v1 Lease, with client-go's semantics: the holder renews the
lease every retry period; a candidate takes it over once it has seen the same record unchanged for a whole
lease duration (its own clock, so node clock skew does not matter); a leader that cannot renew within the
renew deadline stops acting; a leader that shuts down releases the lease so a standby takes over at once."""

from __future__ import annotations

import asyncio
import datetime
import logging
import socket
import uuid

import kr8s
from kr8s.asyncio.objects import new_class

from .config import OperatorConfig

Lease = new_class("Lease", "coordination.k8s.io/v1", namespaced=True)
log = logging.getLogger(__name__)


def _micro_time() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class AlwaysLeader:
    """Leader election turned off (one operator for sure, e.g. in development)."""

    is_leader = True

    async def run(self) -> None:
        return None

    async def release(self) -> None:
        return None


class LeaseElector:
    def __init__(self, api: kr8s.asyncio.Api, config: OperatorConfig, namespace: str) -> None:
        self.api = api
        self.config = config
        self.namespace = namespace
        self.identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        self.is_leader = False
        self._observed: tuple[dict, float] | None = None  # last seen lease spec and when it last changed
        self._renewed_at = 0.0

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    async def run(self) -> None:
        """Try to acquire or renew every retry period, forever."""
        while True:
            try:
                acquired = await self._try_acquire_or_renew()
            except Exception as e:  # refused, unreachable, timed out: not renewed, and the loop must go on
                log.warning("leader election: %s: %s", type(e).__name__, e)
                acquired = False
            if acquired:
                self._renewed_at = self._now()
            self._set_leader(
                acquired or (self.is_leader and self._now() - self._renewed_at < self.config.renew_deadline)
            )
            await asyncio.sleep(self.config.retry_period)

    def _set_leader(self, leader: bool) -> None:
        if leader != self.is_leader:
            log.warning(
                "%s %s leadership (lease %s/%s)",
                self.identity,
                "acquired" if leader else "lost",
                self.namespace,
                self.config.lease_name,
            )
        self.is_leader = leader

    def _record(self, transitions: int, acquire_time: str) -> dict:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.config.lease_duration)),
            "acquireTime": acquire_time,
            "renewTime": _micro_time(),
            "leaseTransitions": transitions,
        }

    async def _try_acquire_or_renew(self) -> bool:
        lease = Lease(
            {"metadata": {"name": self.config.lease_name, "namespace": self.namespace}}, api=self.api
        )
        try:
            await lease.refresh()
        except kr8s.NotFoundError:
            lease = Lease(
                {
                    "metadata": {"name": self.config.lease_name, "namespace": self.namespace},
                    "spec": self._record(0, _micro_time()),
                },
                api=self.api,
            )
            return await self._write(lease.create())
        spec = dict(lease.raw.get("spec") or {})
        holder = spec.get("holderIdentity") or ""
        if self._observed is None or self._observed[0] != spec:
            self._observed = (spec, self._now())
        expired = self._now() - self._observed[1] > (spec.get("leaseDurationSeconds") or 0)
        if holder and holder != self.identity and not expired:
            return False
        ours = holder == self.identity
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if ours else 1)
        record = self._record(transitions, spec.get("acquireTime") if ours else _micro_time())
        # resourceVersion makes the write conditional: of two candidates, only one wins (409 for the other)
        patch = {"metadata": {"resourceVersion": lease.raw["metadata"]["resourceVersion"]}, "spec": record}
        return await self._write(lease.patch(patch))

    async def _write(self, request) -> bool:
        try:
            await request
        except kr8s.ServerError as e:
            if e.response is not None and e.response.status_code == 409:
                return False  # someone else wrote first
            raise
        return True

    async def release(self) -> None:
        """On shutdown: give the lease up (if still ours) so that a standby need not wait for it to expire."""
        self.is_leader = False
        lease = Lease(
            {"metadata": {"name": self.config.lease_name, "namespace": self.namespace}}, api=self.api
        )
        try:
            await lease.refresh()
            if (lease.raw.get("spec") or {}).get("holderIdentity") == self.identity:
                version = lease.raw["metadata"]["resourceVersion"]
                spec = {"holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": _micro_time()}
                await lease.patch({"metadata": {"resourceVersion": version}, "spec": spec})
        except Exception as e:  # shutting down anyway: the lease then expires by itself
            log.warning("leader election: could not release the lease: %s: %s", type(e).__name__, e)
