"""Joining the pool: the first wait for a healthy server, and each member's admission (health, model check,
vocab mapping, agreement), retried with backoff, or its refusal for good."""

from __future__ import annotations

import asyncio
import logging
import random

import aiohttp

from eagle3_target.protocol import encodings
from eagle3_target.protocol.features import FeatureError
from eagle3_target.protocol.model_info import ModelInfo, ModelInfoError

from .agreement import Agreement
from .connection import RequestRejected, ServerError
from .errors import BatchFailedError
from .identity import ModelMismatchError
from .members import Member, MemberState, Roster, short

log = logging.getLogger(__package__ + ".membership")  # one logger for the whole of membership

REFUSALS = (
    ModelMismatchError,
    ModelInfoError,
    encodings.EncodingError,
    FeatureError,
)  # waiting will not help


class Joining(Roster):
    """Admission of members; a healthy member's upkeep (heartbeats) is started by upkeep.py's part."""

    async def start(self) -> None:
        """Resolve (with backoff), check every reachable server's model, wait for one healthy server,
        warning on the options' schedule (wait_log_interval, backing off) which are not ready and why."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.start_timeout
        urls = await self.resolver.resolve_until(deadline, options=self.options)
        probe = min(10.0, self.options.request_timeout)
        infos = await self.model.check_fleet(urls, lambda url: self.connect(url, probe).model_info())
        for url in urls:
            self._add(url, infos.get(url))
        self.spawn(self._refresh_loop())
        self.spawn(self._version_poll())
        await self._first_healthy(deadline)

    async def _first_healthy(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        warn = self.options.wait_warnings(started)
        async with self.changed:
            if not self.healthy():
                log.info(
                    "waiting up to %.0fs for a target server to be ready: %s",
                    self.options.start_timeout,
                    self.describe(),
                )
            while not self.healthy():
                refused = [m.refusal for m in self.members.values() if m.refusal is not None]
                if refused and len(refused) == len(self.members):
                    raise refused[0]
                now = loop.time()
                if now >= deadline:
                    raise BatchFailedError(
                        f"no target server became ready within {self.options.start_timeout:.0f}s: "
                        + self.describe()
                    )
                if warn.due(now):
                    log.warning(
                        "no target server ready after %.0fs of %.0fs: %s",
                        now - started,
                        self.options.start_timeout,
                        self.describe(),
                    )
                await self.wait_changed(min(deadline, warn.at) - now)

    async def settle(self, timeout: float) -> int:
        """Wait (at most ``timeout``) until no server is still joining; return how many are healthy."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with self.changed:
            while any(m.state == MemberState.JOINING for m in self.members.values()):
                left = deadline - loop.time()
                if left <= 0 or not await self.wait_changed(left):
                    break
        healthy = self.healthy()
        if len(healthy) < len(self.members):
            log.warning(
                "%d of %d target servers healthy: %s", len(healthy), len(self.members), self.describe()
            )
        return len(healthy)

    async def set_vocab_mapping(self, blob: bytes) -> None:
        """Remember the mapping for joining servers and send it to every healthy one now."""
        self.vocab_blob = blob
        targets = self.healthy()
        results = await asyncio.gather(
            *(m.conn.set_vocab_mapping(blob) for m in targets), return_exceptions=True
        )
        refusals = [r for r in results if isinstance(r, ServerError) and not r.retryable]
        if refusals and len(refusals) == len(targets):  # every server refused it: the mapping is at fault
            first = refusals[0]
            raise RequestRejected(first.url, first.path, first.status, first.error, first.detail) from first
        for member, result in zip(targets, results, strict=True):
            if isinstance(result, BaseException):
                self.quarantine(member, result)  # it gets the mapping when it rejoins (or is refused then)

    def _add(self, url: str, info: ModelInfo | None = None) -> None:
        member = self.members[url] = Member(self.connect(url), probed_info=info)
        self._start_member_task(member, self._join(member))

    async def _join(self, member: Member) -> None:
        """Admit ``member``, retrying with backoff while it is not ready; refuse it for good on a
        different model, an encoding it lacks, or a 4xx (a wrong token, say). Any other failure (an
        answer no correct server gives included) quarantines it with the reason; this task never dies
        of one. A member quarantined before waits first, longer with each strike."""
        if member.strikes:
            await asyncio.sleep(self.readmit_delay(member.strikes))
        delay = self.options.backoff_base
        while member.state in (MemberState.JOINING, MemberState.QUARANTINED):
            try:
                await self._admit(member)
                return
            except (*REFUSALS, ServerError) as exc:
                if not (isinstance(exc, ServerError) and exc.retryable):
                    self._refuse(member, exc)
                    return
                member.last_error = short(exc)
            except (TimeoutError, aiohttp.ClientConnectionError) as exc:
                member.last_error = short(exc)  # not up (yet): keep waiting quietly
            except Exception as exc:  # a server fault: it answers, wrongly
                self._join_fault(member, exc)
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(self.options.backoff_max, delay * 2)

    def readmit_delay(self, strikes: int) -> float:
        return min(self.options.readmit_backoff_max, self.options.backoff_base * 4**strikes)

    def _join_fault(self, member: Member, exc: BaseException) -> None:
        why = short(exc)
        if why != member.last_error:
            log.warning("%s cannot join: %s", member.url, why)
        member.last_error = why
        if member.state == MemberState.JOINING:
            member.state = MemberState.QUARANTINED
            self.notify()

    def _refuse(self, member: Member, exc: BaseException) -> None:
        member.state = MemberState.REFUSED
        member.refusal = exc
        member.last_error = self.refused[member.url] = str(exc)
        log.error("refusing %s: %s", member.url, exc)
        self.notify()

    async def _admit(self, member: Member) -> None:
        status, body = await member.conn.health()
        if status != 200:
            raise ServerError(member.url, "health", status, str(body.get("status", "not_ready")), "not ready")
        info, member.probed_info = member.probed_info or await member.conn.model_info(), None
        self.model.admit(member.url, info)
        self.learn(member, info)
        options = self.options
        agreement = Agreement.make(
            member.url,
            info,
            options.encoding,
            options.data_path,
            options.request_timeout,
            options.features,
            packing=options.packing,
        )
        sent = None
        while self.vocab_blob is not sent:  # again if it was replaced while we were sending
            sent = self.vocab_blob
            await member.conn.set_vocab_mapping(sent)
        if member.state not in (MemberState.JOINING, MemberState.QUARANTINED):
            agreement.end()
            return
        if member.agreement is not None:
            member.agreement.end()
        member.agreement, member.state, member.last_error = agreement, MemberState.HEALTHY, ""
        log.info("%s is healthy", member.url)
        self._start_member_task(member, self._heartbeats(member))
        self.notify()
