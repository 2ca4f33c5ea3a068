"""Failover and hedging over the pool's healthy servers: pick one, fail over, hedge a silent one.

Each request takes a slot on the least-loaded (or next, round-robin) healthy
server at the wanted target version (versions.py); a transient failure quarantines that server and the request moves on
with jittered exponential backoff until its deadline; a server silent past the
hedge threshold is quarantined and the request also started elsewhere, the
first complete answer winning. Membership (membership.py) decides who is healthy.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp

from eagle3_target.protocol import encodings

from .connection import RequestRejected, ServerError
from .errors import BatchFailedError, ServerFault
from .members import Member, MemberState, short
from .membership import Membership
from .options import PoolOptions
from .p2p import P2PUnavailable
from .versions import StaleVersion

log = logging.getLogger(__package__ + ".dispatch")  # the pool's one logger for dispatch
T = TypeVar("T")
Call = Callable[[Member], Awaitable[T]]


class Failover:
    """Runs a call on one healthy member of ``membership``, failing over and hedging until its deadline."""

    def __init__(self, membership: Membership, options: PoolOptions):
        self.membership, self.options = membership, options
        self._turn = 0
        self.failovers = 0  # attempts that failed on one server and moved on
        self.hedges = 0  # requests re-sent because their server went silent
        self._generate_seconds: collections.deque[float] = collections.deque(maxlen=1000)

    @property
    def members(self) -> dict[str, Member]:
        return self.membership.members

    def healthy(self) -> list[Member]:
        return self.membership.healthy()

    def describe_members(self) -> str:
        """The members and their states, and the wanted target version where no healthy one serves it."""
        healthy, wanted = self.healthy(), self.membership.wanted_version()
        if not healthy or any(self.membership.at_wanted_version(m) for m in healthy):
            return self.membership.describe()
        served = ", ".join(f"{m.url} at {m.version}" for m in healthy)
        return f"{self.membership.describe()}; none serves target version {wanted} ({served})"

    async def with_failover(self, call: Call, what: str, hedge: bool = False) -> T:
        """Run ``call`` on one healthy server; on a server fault quarantine it and try another, with
        jittered exponential backoff, until the deadline (see ``_outcome`` for what is a fault).

        With ``hedge``, a server that stays silent past ``hedge_threshold()`` is quarantined (it rejoins
        once /health answers) and the call is also started on another server; the first complete answer
        wins and the other attempt is cancelled, so the caller still gets exactly one result."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.deadline
        tried: list[str] = []
        rejected: set[str] = set()  # servers that refused this request with a 4xx
        attempt = 0
        running: dict[asyncio.Task, Member] = {}
        try:
            while True:
                if not running:
                    member = await self._acquire(deadline, rejected)
                    if member is None:
                        raise BatchFailedError(
                            f"{what} found no server within {self.options.deadline:.0f}s; tried: "
                            + ("; ".join(tried) or "none")
                            + f". Servers now: {self.describe_members()}"
                        )
                    running[self._attempt(call, member, timed=hedge)] = member
                wait = deadline - loop.time()
                done, _ = await asyncio.wait(
                    running,
                    timeout=max(0.0, min(wait, self.hedge_threshold()) if hedge else wait),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not done:
                    if loop.time() >= deadline:
                        raise BatchFailedError(
                            f"{what} got no answer within {self.options.deadline:.0f}s from "
                            + ", ".join(m.url for m in running.values())
                        )
                    self._hedge(running, call, what)
                    continue
                for task in done:
                    result = self._outcome(task, running.pop(task), tried, rejected)
                    if result is not _FAILED:
                        return result
                if not running:
                    delay = min(self.options.backoff_max, self.options.backoff_base * 2**attempt)
                    attempt += 1
                    await asyncio.sleep(
                        max(0.0, min(delay * random.uniform(0.5, 1.0), deadline - loop.time()))
                    )
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    def _outcome(self, task: asyncio.Task, member: Member, tried: list[str], rejected: set[str]):
        """A finished attempt's result, or _FAILED to try again. Every failure is the server's (it is
        quarantined) except: a 429 with Retry-After (backpressure: that server rests, unquarantined),
        and a 4xx about the request itself, raised as RequestRejected once every healthy server has
        refused it. Errors of the caller's own (RequestRejected, P2PUnavailable, ...) are raised."""
        error = task.exception()
        if error is None:
            member.strikes = 0
            for url in rejected:  # they refused what this server answered: the fault was theirs
                self._quarantine_url(url, ServerFault(f"refused a request {member.url} served"))
            return task.result()
        if isinstance(error, (BatchFailedError, RequestRejected, P2PUnavailable, encodings.EncodingError)):
            raise error
        tried.append(f"{member.url}: {short(error)}")
        if isinstance(
            error, StaleVersion
        ):  # refreshed under us: dispatch now sends it nothing, or this again
            return _FAILED
        if isinstance(error, ServerError) and error.status == 429 and error.retry_after is not None:
            self.membership.rest(member, error.retry_after)
            return _FAILED
        if isinstance(error, ServerError) and not error.retryable:
            rejected.add(member.url)
            if {m.url for m in self.healthy()} <= rejected:
                raise RequestRejected(
                    error.url, error.path, error.status, error.error, error.detail
                ) from error
            return _FAILED
        if isinstance(error, aiohttp.ClientConnectionError):
            self.membership.resolve_now.set()  # the server may be gone: ask DNS again soon
        self.failovers += 1
        self.membership.quarantine(member, error)
        return _FAILED

    def _quarantine_url(self, url: str, error: BaseException) -> None:
        member = self.members.get(url)
        if member is not None:
            self.failovers += 1
            self.membership.quarantine(member, error)

    def hedge_threshold(self) -> float:
        """max(hedge_after, factor x p99 of recent /generate times): never below the floor, and a slow
        model (long sequences, a big target) raises it instead of being hedged all the time."""
        samples = sorted(self._generate_seconds)
        p99 = samples[int(0.99 * (len(samples) - 1))] if samples else 0.0
        return max(self.options.hedge_after, self.options.hedge_p99_factor * p99)

    def _attempt(self, call: Call, member: Member, timed: bool) -> asyncio.Task:
        """``call`` on ``member`` as a task that frees the member's slot however it ends."""

        async def attempt():
            loop = asyncio.get_running_loop()
            started = loop.time()
            try:
                result = await call(member)
            finally:
                self.membership.release(member)
            if timed:
                self._generate_seconds.append(loop.time() - started)
            return result

        return asyncio.create_task(attempt())

    def _hedge(self, running: dict[asyncio.Task, Member], call: Call, what: str) -> None:
        """Every server holding this request has been silent past the threshold: mark them unhealthy and
        start the request on one more free server, if there is one now (else keep waiting)."""
        threshold = self.hedge_threshold()
        for member in running.values():
            if member.state == MemberState.HEALTHY:
                log.warning(
                    "%s has not answered %s for %.1fs; marking it unhealthy until /health answers, "
                    "re-sending the request to another server",
                    member.url,
                    what,
                    threshold,
                )
                self.membership.quarantine(member, TimeoutError(f"silent for {threshold:.1f}s on {what}"))
        member = self._pick()
        if member is not None:
            member.in_flight += 1
            self.hedges += 1
            running[self._attempt(call, member, timed=True)] = member

    # -- slots -----------------------------------------------------------------------------

    async def _acquire(self, deadline: float, rejected: set[str] = frozenset()) -> Member | None:
        loop = asyncio.get_running_loop()
        async with self.membership.changed:
            while True:
                left = deadline - loop.time()
                if left <= 0:  # past it, start nothing: a server answering at once would be retried forever
                    return None
                member = self._pick(rejected)
                if member is not None:
                    member.in_flight += 1
                    return member
                resting = [m.rest_until for m in self.healthy() if m.rest_until > loop.time()]
                await self.membership.wait_changed(min([left, *(t - loop.time() for t in resting)]))

    def _pick(self, rejected: set[str] = frozenset()) -> Member | None:
        now = asyncio.get_running_loop().time()
        wanted = self.membership.wanted_version()  # once per pick: the newest is a count over the members
        free = [
            m
            for m in self.healthy()
            if m.in_flight < self.options.max_in_flight
            and m.rest_until <= now
            and m.url not in rejected
            and (wanted is None or m.version == wanted)
        ]
        if not free:
            return None
        self._turn += 1
        start = self._turn % len(free)
        rotated = free[start:] + free[:start]  # rotation breaks ties fairly
        if self.options.policy == "round-robin":
            return rotated[0]
        return min(rotated, key=lambda m: m.in_flight)


_FAILED = object()  # an attempt that failed over
