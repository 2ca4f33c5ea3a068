"""A member's upkeep while it is in the pool: heartbeats keep our session alive on each healthy server, and
DNS is re-resolved on a schedule (or at once when dispatch asks) so new servers join and vanished ones drain."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from .endpoints import DNS_ERRORS
from .members import Member, MemberState, Roster, short

log = logging.getLogger(__package__ + ".membership")  # one logger for the whole of membership


class Upkeep(Roster):
    """Heartbeats and DNS refresh."""

    async def _heartbeats(self, member: Member) -> None:
        """Keep our session alive on the server; a failed heartbeat quarantines the server."""
        while member.state == MemberState.HEALTHY:
            await asyncio.sleep(self.options.heartbeat_interval)
            if member.state != MemberState.HEALTHY:
                return
            try:
                await member.conn.heartbeat()
            except Exception as exc:  # any answer but a good one: this task must not die of it
                self.quarantine(member, exc)
                return

    async def _refresh_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.resolve_now.wait(), self.options.resolve_interval)
            self.resolve_now.clear()
            started = loop.time()
            try:
                await self.refresh()
            except Exception as exc:  # this loop finds new servers: it must outlive any answer
                log.warning(
                    "re-resolving target endpoints failed (keeping %d servers): %s",
                    len(self.members),
                    short(exc),
                )
            await asyncio.sleep(max(0.0, self.options.min_resolve_gap - (loop.time() - started)))

    async def refresh(self) -> None:
        """Resolve once and apply: new URLs join, vanished ones drain. A DNS failure changes nothing."""
        try:
            urls = set(await self.resolver.resolve())
        except DNS_ERRORS as exc:
            log.warning(
                "re-resolving target endpoints failed (keeping %d servers): %s", len(self.members), exc
            )
            return
        for url in urls - self.members.keys():
            log.info("new target server %s", url)
            self.refused.pop(url, None)
            self._add(url)
        for url, member in list(self.members.items()):
            if url not in urls and member.state != MemberState.DRAINING:
                log.info("target server %s left DNS; draining", url)
                member.state = MemberState.DRAINING
                if member.in_flight == 0:
                    self._retire(member)
        self.notify()
