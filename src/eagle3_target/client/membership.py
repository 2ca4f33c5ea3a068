"""Who is in the pool: join, heartbeats, DNS refresh, quarantine and retirement of target servers.

A member's life: JOINING (waits for /health, checks its model against the
fleet's, receives the vocab mapping, makes its agreement) -> HEALTHY (takes
requests, sends heartbeats) -> QUARANTINED after a failure (re-probed through
/health, then joins again) -> DRAINING once DNS no longer lists it (finishes
what it holds, then our session there is ended). REFUSED members serve another
model, or refused us for good (a 4xx such as a wrong token).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from eagle3_target.protocol import encodings
from eagle3_target.protocol.features import FeatureError
from eagle3_target.protocol.model_info import ModelInfo, ModelInfoError

from .agreement import Agreement
from .connection import TRANSIENT_ERRORS, RequestRejected, ServerConnection, ServerError
from .endpoints import DNS_ERRORS, EndpointResolver
from .errors import BatchFailedError
from .identity import FleetModel, ModelMismatchError
from .options import PoolOptions

log = logging.getLogger(__name__)

REFUSALS = (
    ModelMismatchError,
    ModelInfoError,
    encodings.EncodingError,
    FeatureError,
)  # waiting will not help


class MemberState(enum.Enum):
    JOINING = "joining"
    HEALTHY = "healthy"
    QUARANTINED = "quarantined"
    DRAINING = "draining"
    REFUSED = "refused"


@dataclass
class Member:
    conn: ServerConnection
    state: MemberState = MemberState.JOINING
    in_flight: int = 0
    last_error: str = ""
    refusal: BaseException | None = None
    agreement: Agreement | None = None  # set at each admission, whole
    probed_info: ModelInfo | None = None  # /model_info read before the first join, used by it
    strikes: int = 0  # quarantines since its last good answer: each quadruples the wait before it rejoins
    rest_until: float = 0.0  # loop time before which it takes no request (it answered 429 + Retry-After)
    tasks: set[asyncio.Task] = field(default_factory=set)

    @property
    def url(self) -> str:
        return self.conn.url


class Membership:
    def __init__(
        self,
        resolver: EndpointResolver,
        connect: Callable[..., ServerConnection],
        options: PoolOptions,
    ):
        self.resolver, self.connect, self.options = resolver, connect, options
        self.members: dict[str, Member] = {}
        self.model = FleetModel()
        self.refused: dict[str, str] = {}  # url -> why
        self.vocab_blob: bytes | None = None  # sent to every member as it joins
        self.changed = asyncio.Condition()  # notified when membership or load changes
        self.resolve_now = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()

    # -- start and stop --------------------------------------------------------------------

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
        await self._first_healthy(deadline)

    async def _first_healthy(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        warn = self.options.wait_warnings(started)
        async with self.changed:
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
                        "no target server ready after %.0fs (start_timeout %.0fs): %s",
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

    async def close(self) -> None:
        """Stop background work and end our sessions (only ours: the servers keep running)."""
        tasks = [*self._tasks, *(t for m in self.members.values() for t in m.tasks)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(self._disconnect(m) for m in self.members.values()), return_exceptions=True)
        self.members.clear()

    # -- views -----------------------------------------------------------------------------

    def healthy(self) -> list[Member]:
        # list() copies in one step, so the trainer thread can call this while the loop changes members.
        return [m for m in list(self.members.values()) if m.state == MemberState.HEALTHY]

    def describe(self) -> str:
        parts = [
            f"{m.url} {m.state.value}" + (f" ({m.last_error})" if m.last_error else "")
            for m in self.members.values()
        ]
        parts += [f"{url} refused ({why})" for url, why in self.refused.items() if url not in self.members]
        return "; ".join(parts) or "no servers"

    # -- the vocab mapping -----------------------------------------------------------------

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

    # -- joining ---------------------------------------------------------------------------

    def _add(self, url: str, info: ModelInfo | None = None) -> None:
        member = self.members[url] = Member(self.connect(url), probed_info=info)
        self._start_member_task(member, self._join(member))

    def _start_member_task(self, member: Member, coro) -> None:
        task = asyncio.create_task(coro)
        member.tasks.add(task)
        task.add_done_callback(member.tasks.discard)

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

    # -- leaving ---------------------------------------------------------------------------

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

    # -- DNS -------------------------------------------------------------------------------

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

    # -- change notification ---------------------------------------------------------------

    async def wait_changed(self, timeout: float) -> bool:
        """Wait (holding ``changed``) until membership or load changes; False on timeout."""
        try:
            await asyncio.wait_for(self.changed.wait(), max(0.0, timeout))
            return True
        except TimeoutError:
            return False

    def notify(self) -> None:
        async def wake():
            async with self.changed:
                self.changed.notify_all()

        self.spawn(wake())

    def spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def short(error: BaseException) -> str:
    """One line saying why a server failed; a refused or unresolvable address says so in words."""
    if isinstance(error, aiohttp.ClientConnectorError):
        code, words = error.os_error.errno, error.os_error.strerror
        why = os.strerror(code) if code and code > 0 else words or str(error.os_error)
        return f"cannot connect to {error.host}:{error.port}: {why}"
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return text if len(text) <= 300 else text[:300] + "..."  # a server chooses these words: keep them short
