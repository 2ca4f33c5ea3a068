"""Fair turns at the model: queued /generate work from several sessions is served in turn.

One request computes at a time. Who goes next is decided by start-time fair queuing by tokens
(a deficit round-robin without a quantum): each queued request gets a virtual start tag, the
later of the scheduler's virtual time and the end of its session's previous request, and its
session's virtual time advances by its tokens over its weight. The smallest tag goes first, ties
in arrival order. So a session with eight requests queued takes turns with sessions that have one
each instead of going first eight times, a session of long sequences gets as many tokens as one
of short sequences (not as many requests), and a session alone is served back to back: the model
is never idle while anything is queued. Weights come from a priority class the request names.

A turn whose tokens say little of its cost (a decode step runs one token through the whole model) is charged
in time instead: tokens_for() turns the seconds it held the model into the tokens supervision turns run in
as long, so a generation's share is one of model time, like everyone else's.

A per-session cap on queued requests refuses the one past it with QueueFull (429 + Retry-After),
which our client takes as backpressure.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from prometheus_client import Gauge, Histogram

from eagle3_target.protocol.contract import PRIORITIES

from .errors import Forbidden, InvalidInput, QueueFull
from .options import DEFAULT_MAX_QUEUED_PER_SESSION, DEFAULT_PRIORITY

_EWMA = 0.2  # weight of the newest turn in the mean turn length behind Retry-After


def priority_class(asked: str | None, bound: str) -> str:
    """The class a request runs in: the one it names (default "normal"), if the server grants it."""
    name = (asked or DEFAULT_PRIORITY).strip().lower()
    if name not in PRIORITIES:
        raise InvalidInput("invalid_priority", f"priority {asked!r} is not one of {', '.join(PRIORITIES)}")
    if PRIORITIES[name] > PRIORITIES[bound]:
        raise Forbidden("priority_not_allowed", f"this server grants priority up to {bound!r}, not {name!r}")
    return name


@dataclass(order=True)
class _Waiter:
    start: float
    order: int
    session: str = field(compare=False)
    priority: str = field(compare=False)
    queued_at: float = field(compare=False)
    granted: asyncio.Future = field(compare=False)  # cancelled with its task: skipped when popped


class FairScheduler:
    """An asyncio lock whose waiters are served in fair turns by session (see the module doc)."""

    def __init__(
        self,
        max_queued_per_session: int = DEFAULT_MAX_QUEUED_PER_SESSION,
        *,
        queued: Gauge | None = None,
        wait_seconds: Histogram | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.max_queued_per_session = max_queued_per_session
        self._queued_gauge, self._wait_seconds, self._clock = queued, wait_seconds, clock
        self._heap: list[_Waiter] = []
        self._order = itertools.count()
        self._virtual = 0.0  # the start tag of the request holding (or last holding) the turn
        self._finish: dict[str, float] = {}  # session -> virtual end of its latest request
        self._queued: Counter[str] = Counter()  # session -> requests waiting (not the one computing)
        self._busy = False
        self._turn_seconds = 0.0  # a moving mean of how long one turn holds the model
        self._seconds_per_token = 0.0  # a moving mean over turns charged by their tokens; 0: none seen yet

    @property
    def waiting(self) -> int:
        return sum(self._queued.values())

    def queued(self, session: str) -> int:
        return self._queued[session]

    def tokens_for(self, seconds: float, fallback: int) -> int:
        """The tokens a turn charged by its tokens runs in ``seconds``; ``fallback`` before any such turn."""
        if not self._seconds_per_token:
            return fallback
        return max(1, math.ceil(seconds / self._seconds_per_token))

    @contextlib.asynccontextmanager
    async def turn(
        self, session: str, tokens: int, priority: str = DEFAULT_PRIORITY, *, by_tokens: bool = True
    ) -> AsyncIterator[None]:
        """Wait for this request's turn at the model and hold it inside the block. ``by_tokens``: the
        turn's tokens measure its cost (a forward over them); False for a charge from tokens_for()."""
        waiter = self._enqueue(session, tokens, priority)
        if not self._busy:
            self._grant_next()
        try:
            await waiter.granted
        except asyncio.CancelledError:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self._grant_next()  # handed the turn as it was cancelled: hand it on
            else:
                self._dequeued(waiter)
            raise
        start = self._clock()
        try:
            yield
        finally:
            held = self._clock() - start
            self._turn_seconds += _EWMA * (held - self._turn_seconds) if self._turn_seconds else held
            if by_tokens and tokens:
                rate = held / tokens
                self._seconds_per_token += (
                    _EWMA * (rate - self._seconds_per_token) if self._seconds_per_token else rate
                )
            self._grant_next()

    def _enqueue(self, session: str, tokens: int, priority: str) -> _Waiter:
        if self._queued[session] >= self.max_queued_per_session:
            retry = max(1, math.ceil(self._turn_seconds * (self.waiting + 1)))
            raise QueueFull(
                "too_many_queued",
                f"this session already has {self._queued[session]} requests queued "
                f"(--max-queued-per-session {self.max_queued_per_session}); retry after {retry}s",
                retry_after=retry,
            )
        start = max(self._virtual, self._finish.get(session, 0.0))
        self._finish[session] = start + tokens / PRIORITIES[priority]
        waiter = _Waiter(
            start,
            next(self._order),
            session,
            priority,
            self._clock(),
            asyncio.get_running_loop().create_future(),
        )
        heapq.heappush(self._heap, waiter)
        self._queued[session] += 1
        if self._queued_gauge is not None:
            self._queued_gauge.labels(priority).inc()
        return waiter

    def _dequeued(self, waiter: _Waiter) -> None:
        self._queued[waiter.session] -= 1
        if not self._queued[waiter.session]:
            del self._queued[waiter.session]
        if self._queued_gauge is not None:
            self._queued_gauge.labels(waiter.priority).dec()

    def _grant_next(self) -> None:
        """Hand the turn to the waiter with the smallest start tag, or mark the model free."""
        while self._heap:
            waiter = heapq.heappop(self._heap)
            if waiter.granted.cancelled():  # its task counts it out as it unwinds
                continue
            self._busy = True
            self._virtual = waiter.start
            self._dequeued(waiter)
            if self._wait_seconds is not None:
                self._wait_seconds.labels(waiter.priority).observe(self._clock() - waiter.queued_at)
            self._forget_idle()
            waiter.granted.set_result(None)
            return
        self._busy = False
        # Idle: every request has ended, so start-time fair queueing puts virtual time past every finish tag and
        # all sessions start level. Forgetting them keeps memory flat under one-shot sessions served in turn.
        self._finish.clear()

    def _forget_idle(self) -> None:
        """Drop the virtual ends that no longer matter (at or before virtual time, nothing queued)."""
        for session in [
            s for s, end in self._finish.items() if end <= self._virtual and s not in self._queued
        ]:
            del self._finish[session]
