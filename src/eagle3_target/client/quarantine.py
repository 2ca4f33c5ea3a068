"""Leaving dispatch, for a while or for good: quarantine after a failure (the member rejoins through /health),
rest on backpressure, release of a request's slot, retirement of a member DNS dropped, and closing."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from .connection import TRANSIENT_ERRORS, ServerError
from .members import Member, MemberState, Roster, short

log = logging.getLogger(__package__ + ".membership")  # one logger for the whole of membership


class Quarantine(Roster):
    """Quarantine, rest, release, retirement and close."""

    def quarantine(self, member: Member, error: BaseException) -> None:
        """Take a healthy member out of dispatch until it joins again through /health."""
        member.last_error = short(error)
        if member.state != MemberState.HEALTHY:
            return
        log.warning("quarantining %s: %s", member.url, member.last_error)
        member.strikes += 1
        member.state = MemberState.QUARANTINED
        self._start_member_task(member, self._join(member))
        self.notify()

    def rest(self, member: Member, seconds: float) -> None:
        """Backpressure (429 + Retry-After): no requests to ``member`` for ``seconds``; it stays healthy."""
        loop = asyncio.get_running_loop()
        if member.rest_until <= loop.time():
            log.info("%s asks us to wait %.1fs (429)", member.url, seconds)
        member.rest_until = loop.time() + seconds
        self.notify()

    def release(self, member: Member) -> None:
        """A request on ``member`` ended: free its slot, and retire it if it was draining."""
        member.in_flight -= 1
        if member.state == MemberState.DRAINING and member.in_flight == 0:
            self._retire(member)
        self.notify()

    def _retire(self, member: Member) -> None:
        if self.members.get(member.url) is member:
            del self.members[member.url]
        for task in member.tasks:
            task.cancel()
        self.spawn(self._disconnect(member))

    async def _disconnect(self, member: Member) -> None:
        if member.agreement is not None:
            member.agreement.end()
        with contextlib.suppress(ServerError, *TRANSIENT_ERRORS):
            await member.conn.disconnect(timeout=2.0)

    async def close(self) -> None:
        """Stop background work and end our sessions (only ours: the servers keep running)."""
        tasks = [*self._tasks, *(t for m in self.members.values() for t in m.tasks)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(self._disconnect(m) for m in self.members.values()), return_exceptions=True)
        self.members.clear()
