"""The pool of target servers: membership, admission, quarantine, and failover of each request.

A member's life: JOINING (waits for /health, checks model_info against the
pool's reference, receives the vocab mapping) -> HEALTHY (takes requests,
sends heartbeats) -> QUARANTINED after a failure (re-probed through /health,
then joins again) -> DRAINING once DNS no longer lists it (finishes what it
holds, then our session there is ended). REFUSED members serve another model.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import aiohttp
import torch

from eagle3_target.protocol import encodings
from eagle3_target.protocol.model_info import ModelInfo, ModelInfoError

from .connection import TRANSIENT_ERRORS, Reply, ServerConnection, ServerError
from .endpoints import DNS_ERRORS, EndpointResolver
from .p2p import DATA_PATHS, P2PChannel, P2PUnavailable, offered_backend

log = logging.getLogger(__name__)
T = TypeVar("T")

JOINING, HEALTHY, QUARANTINED, DRAINING, REFUSED = "joining", "healthy", "quarantined", "draining", "refused"
POLICIES = ("least-loaded", "round-robin")


class ModelMismatchError(RuntimeError):
    """Servers behind one endpoint spec serve different targets."""


class BatchFailedError(RuntimeError):
    """A request found no server that answered it before its deadline."""


@dataclass
class PoolOptions:
    request_timeout: float = 120.0  # one attempt on one server
    deadline: float = 600.0  # all attempts of one request, failover included
    start_timeout: float = 300.0  # resolving and the first healthy server
    max_in_flight: int = 1  # per server, as NeMo
    policy: str = "least-loaded"
    resolve_interval: float = 30.0
    min_resolve_gap: float = 1.0  # after errors, re-resolve at most this often
    heartbeat_interval: float = 15.0
    backoff_base: float = 0.05
    backoff_max: float = 5.0
    data_path: str = "auto"  # "auto": GPU-direct when both sides can; "wire"; "p2p" (gloo too; see p2p.py)
    # A /generate still unanswered after max(hedge_after, hedge_p99_factor x the observed p99) is re-sent
    # to another server: a stopped process or wedged GPU keeps its socket open, so only time tells.
    hedge_after: float = 10.0
    hedge_p99_factor: float = 5.0
    # "auto": per server, "logits" when offered, else "nemo" (both exact, so a mixed fleet agrees bit for bit)
    encoding: str = encodings.AUTO

    def __post_init__(self):
        if self.encoding not in encodings.CHOICES:
            raise ValueError(f"unknown encoding {self.encoding!r}; choose {', '.join(encodings.CHOICES)}")
        if self.data_path not in DATA_PATHS:
            raise ValueError(f"unknown data path {self.data_path!r}; choose {', '.join(DATA_PATHS)}")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown dispatch policy {self.policy!r}; choose {', '.join(POLICIES)}")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")


@dataclass
class Member:
    conn: ServerConnection
    state: str = JOINING
    in_flight: int = 0
    last_error: str = ""
    refusal: BaseException | None = None
    tasks: set[asyncio.Task] = field(default_factory=set)
    probed_info: ModelInfo | None = None  # /model_info read before the first join, used by it

    @property
    def url(self) -> str:
        return self.conn.url


class TargetPool:
    def __init__(
        self,
        resolver: EndpointResolver,
        session_id: str,
        *,
        auth_token: str | None = None,
        options: PoolOptions | None = None,
    ):
        self.resolver = resolver
        self.session_id = session_id
        self.auth_token = auth_token
        self.options = options or PoolOptions()
        self.members: dict[str, Member] = {}
        self.reference: ModelInfo | None = None  # model_info every member must match
        self.refused: dict[str, str] = {}  # url -> why
        self.vocab_blob: bytes | None = None
        self._head_rows: tuple[bytes, torch.Tensor] | None = None  # (vocab blob, its lm_head rows)
        self._head_lock = asyncio.Lock()
        self._changed = asyncio.Condition()
        self._resolve_now = asyncio.Event()
        self._turn = 0
        self.failovers = 0  # attempts that failed on one server and moved on
        self.hedges = 0  # requests re-sent because their server went silent
        self._generate_seconds: collections.deque[float] = collections.deque(maxlen=1000)
        self._tasks: set[asyncio.Task] = set()
        self._http: aiohttp.ClientSession | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Resolve (with backoff), check every reachable server's model, wait for one healthy server."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.start_timeout
        # trust_env=False: proxy variables in a trainer pod must not capture target traffic.
        self._http = aiohttp.ClientSession(trust_env=False, connector=aiohttp.TCPConnector(limit=0))
        urls = await self.resolver.resolve_until(deadline)
        infos = await self._check_initial_models(urls)
        for url in urls:
            self._add(url, infos.get(url))
        self._spawn(self._refresh_loop())
        async with self._changed:
            while not self.healthy():
                refused = [m.refusal for m in self.members.values() if m.refusal is not None]
                if refused and len(refused) == len(self.members):
                    raise refused[0]
                left = deadline - loop.time()
                if left <= 0 or not await self._wait_changed(left):
                    raise BatchFailedError(
                        f"no target server became ready within {self.options.start_timeout:.0f}s: "
                        + self.describe_members()
                    )

    async def settle(self, timeout: float) -> int:
        """Wait (at most ``timeout``) until no server is still joining; return how many are healthy.

        start() returns as soon as one server is ready; a benchmark or probe wants the whole fleet."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with self._changed:
            while any(m.state == JOINING for m in self.members.values()):
                left = deadline - loop.time()
                if left <= 0 or not await self._wait_changed(left):
                    break
        return len(self.healthy())

    async def _check_initial_models(self, urls: list[str]) -> dict[str, ModelInfo]:
        """Refuse a mixed fleet up front rather than admitting whichever server answers first.
        Returns the answers, which the first join of each server uses instead of asking again."""
        probe = aiohttp.ClientTimeout(total=min(10.0, self.options.request_timeout))
        infos = await asyncio.gather(
            *(self._connection(url, probe).model_info() for url in urls), return_exceptions=True
        )
        answered = {url: info for url, info in zip(urls, infos, strict=False) if isinstance(info, ModelInfo)}
        if not answered:
            return {}  # none ready yet: the join tasks will set the reference
        groups: dict[str, list[str]] = {}
        for url, info in answered.items():
            groups.setdefault(info.describe(), []).append(url)
        if len(groups) > 1:
            lines = "; ".join(f"{', '.join(servers)} serve {model}" for model, servers in groups.items())
            raise ModelMismatchError(f"target servers disagree on the model: {lines}")
        self.reference = next(iter(answered.values()))
        return answered

    async def close(self) -> None:
        """Stop background work and end our sessions (only ours: the servers keep running)."""
        for task in list(self._tasks) + [t for m in self.members.values() for t in m.tasks]:
            task.cancel()
        await asyncio.gather(
            *self._tasks, *(t for m in self.members.values() for t in m.tasks), return_exceptions=True
        )
        await asyncio.gather(*(self._disconnect(m) for m in self.members.values()), return_exceptions=True)
        self.members.clear()
        if self._http is not None:
            await self._http.close()

    # -- views -----------------------------------------------------------------------------

    def healthy(self) -> list[Member]:
        # list() copies in one step, so the trainer thread can call this while the loop changes members.
        return [m for m in list(self.members.values()) if m.state == HEALTHY]

    def describe_members(self) -> str:
        parts = [
            f"{m.url} {m.state}" + (f" ({m.last_error})" if m.last_error else "")
            for m in self.members.values()
        ]
        parts += [f"{url} refused ({why})" for url, why in self.refused.items() if url not in self.members]
        return "; ".join(parts) or "no servers"

    # -- the calls callers make ------------------------------------------------------------

    async def generate(self, request: bytes, batch: int, seq: int, draft_vocab: int) -> Reply:
        async def call(conn: ServerConnection) -> Reply:
            reply = await conn.generate(request, batch, seq, draft_vocab)
            if reply.encoding == encodings.HIDDEN:
                reply = dataclasses.replace(reply, head_rows=await self._lm_head(conn, draft_vocab))
            return reply

        return await self.with_failover(call, what="/generate", hedge=True)

    async def _lm_head(self, conn: ServerConnection, draft_vocab: int) -> torch.Tensor:
        """The lm_head rows of the current draft vocabulary: fetched once per mapping, from ``conn``."""
        async with self._head_lock:
            blob = conn.vocab_blob
            if self._head_rows is None or self._head_rows[0] is not blob:
                self._head_rows = (blob, await conn.lm_head(draft_vocab))
            return self._head_rows[1]

    async def input_embeddings(self):
        return await self.with_failover(lambda conn: conn.input_embeddings(), what="/input_embeddings")

    async def set_vocab_mapping(self, blob: bytes) -> None:
        """Remember the mapping for joining servers and send it to every healthy one now."""
        self.vocab_blob = blob
        for member in self.members.values():
            member.conn.vocab_blob = blob
        targets = self.healthy()
        results = await asyncio.gather(*(m.conn.set_vocab_mapping() for m in targets), return_exceptions=True)
        for member, result in zip(targets, results, strict=False):
            if isinstance(result, ServerError) and not result.retryable:
                raise result
            if isinstance(result, BaseException):
                self._quarantine(member, result)  # it gets the mapping when it rejoins

    async def with_failover(
        self, call: Callable[[ServerConnection], Awaitable[T]], what: str, hedge: bool = False
    ) -> T:
        """Run ``call`` on one healthy server; on a transient failure quarantine it and try another,
        with jittered exponential backoff, until the deadline. 4xx answers are raised at once.

        With ``hedge``, a server that stays silent past ``hedge_threshold()`` is quarantined (it rejoins
        once /health answers) and the call is also started on another server; the first complete answer
        wins and the other attempt is cancelled, so the caller still gets exactly one result."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.deadline
        tried: list[str] = []
        attempt = 0
        running: dict[asyncio.Task, Member] = {}
        try:
            while True:
                if not running:
                    member = await self._acquire(deadline)
                    if member is None:
                        raise BatchFailedError(
                            f"{what} found no server within {self.options.deadline:.0f}s; tried: "
                            + ("; ".join(tried) or "none")
                            + f". Servers now: {self.describe_members()}"
                        )
                    running[self._attempt(call, member, timed=hedge)] = member
                wait = deadline - loop.time()
                if hedge:
                    wait = min(wait, self.hedge_threshold())
                done, _ = await asyncio.wait(
                    running, timeout=max(0.0, wait), return_when=asyncio.FIRST_COMPLETED
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
                    member = running.pop(task)
                    error = task.exception()
                    if error is None:
                        return task.result()
                    if isinstance(error, ServerError) and not error.retryable:
                        raise error
                    if not isinstance(error, (ServerError, *TRANSIENT_ERRORS)):
                        raise error
                    if not isinstance(error, ServerError):
                        self._resolve_now.set()  # the server may be gone: ask DNS again soon
                    tried.append(f"{member.url}: {_short(error)}")
                    self.failovers += 1
                    self._quarantine(member, error)
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

    def hedge_threshold(self) -> float:
        """max(hedge_after, factor x p99 of recent /generate times): never below the floor, and a slow
        model (long sequences, a big target) raises it instead of being hedged all the time."""
        samples = sorted(self._generate_seconds)
        p99 = samples[int(0.99 * (len(samples) - 1))] if samples else 0.0
        return max(self.options.hedge_after, self.options.hedge_p99_factor * p99)

    def _attempt(self, call: Callable[[ServerConnection], Awaitable[T]], member: Member, timed: bool):
        """``call`` on ``member`` as a task that frees the member's slot however it ends."""

        async def attempt() -> T:
            loop = asyncio.get_running_loop()
            started = loop.time()
            try:
                result = await call(member.conn)
            finally:
                self._release(member)
            if timed:
                self._generate_seconds.append(loop.time() - started)
            return result

        return asyncio.create_task(attempt())

    def _hedge(self, running: dict[asyncio.Task, Member], call, what: str) -> None:
        """Every server holding this request has been silent past the threshold: mark them unhealthy and
        start the request on one more free server, if there is one now (else keep waiting)."""
        threshold = self.hedge_threshold()
        for member in running.values():
            if member.state == HEALTHY:
                log.warning(
                    "%s has not answered %s for %.1fs; marking it unhealthy until /health answers, "
                    "re-sending the request to another server",
                    member.url,
                    what,
                    threshold,
                )
                self._quarantine(member, TimeoutError(f"silent for {threshold:.1f}s on {what}"))
        member = self._pick()
        if member is not None:
            member.in_flight += 1
            self.hedges += 1
            running[self._attempt(call, member, timed=True)] = member

    # -- slots -----------------------------------------------------------------------------

    async def _acquire(self, deadline: float) -> Member | None:
        loop = asyncio.get_running_loop()
        async with self._changed:
            while True:
                member = self._pick()
                if member is not None:
                    member.in_flight += 1
                    return member
                left = deadline - loop.time()
                if left <= 0:
                    return None
                await self._wait_changed(left)

    def _pick(self) -> Member | None:
        free = [
            m
            for m in self.members.values()
            if m.state == HEALTHY and m.in_flight < self.options.max_in_flight
        ]
        if not free:
            return None
        self._turn += 1
        start = self._turn % len(free)
        rotated = free[start:] + free[:start]  # rotation breaks ties fairly
        if self.options.policy == "round-robin":
            return rotated[0]
        return min(rotated, key=lambda m: m.in_flight)

    def _release(self, member: Member) -> None:
        member.in_flight -= 1
        if member.state == DRAINING and member.in_flight == 0:
            self._retire(member)
        self._notify()

    async def _wait_changed(self, timeout: float) -> bool:
        """Wait (holding the condition) until membership or load changes; False on timeout."""
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
            return True
        except TimeoutError:
            return False

    def _notify(self) -> None:
        async def wake():
            async with self._changed:
                self._changed.notify_all()

        self._spawn(wake())

    # -- membership ------------------------------------------------------------------------

    def _connection(self, url: str, timeout: aiohttp.ClientTimeout | None = None) -> ServerConnection:
        assert self._http is not None
        conn = ServerConnection(
            url, self._http, self.session_id, auth_token=self.auth_token, timeout=self.options.request_timeout
        )
        if timeout is not None:
            conn.timeout = timeout
        conn.vocab_blob = self.vocab_blob
        return conn

    def _add(self, url: str, info: ModelInfo | None = None) -> None:
        member = self.members[url] = Member(self._connection(url), probed_info=info)
        self._start_member_task(member, self._join(member))

    def _start_member_task(self, member: Member, coro) -> None:
        task = asyncio.create_task(coro)
        member.tasks.add(task)
        task.add_done_callback(member.tasks.discard)

    def _quarantine(self, member: Member, error: BaseException) -> None:
        member.last_error = _short(error)
        if member.state != HEALTHY:
            return
        log.warning("quarantining %s: %s", member.url, member.last_error)
        member.state = QUARANTINED
        self._start_member_task(member, self._join(member))
        self._notify()

    async def _join(self, member: Member) -> None:
        """Probe /health with backoff until ready, check the model, send the vocab mapping, go healthy."""
        delay = self.options.backoff_base
        while member.state in (JOINING, QUARANTINED):
            try:
                await self._admit(member)
                return
            except (ModelMismatchError, ModelInfoError, encodings.EncodingError, ServerError) as exc:
                if isinstance(exc, ServerError) and exc.retryable:
                    member.last_error = _short(exc)
                else:  # another model, or a 4xx such as a wrong token: waiting will not help
                    member.state = REFUSED
                    member.refusal = exc
                    member.last_error = self.refused[member.url] = str(exc)
                    log.error("refusing %s: %s", member.url, exc)
                    self._notify()
                    return
            except TRANSIENT_ERRORS as exc:
                member.last_error = _short(exc)
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(self.options.backoff_max, delay * 2)

    async def _admit(self, member: Member) -> None:
        status, body = await member.conn.health()
        if status != 200:
            raise ServerError(member.url, "health", status, str(body.get("status", "not_ready")), "not ready")
        info, member.probed_info = member.probed_info or await member.conn.model_info(), None
        if self.reference is None:
            self.reference = info
        diff = self.reference.difference(info)
        if diff:
            raise ModelMismatchError(f"{member.url} serves a different target: {'; '.join(diff)}")
        member.conn.info = info
        member.conn.encoding = encodings.choose(self.options.encoding, encodings.offered(info), member.url)
        self._attach_p2p(member.conn)
        while member.conn.vocab_blob is not None:
            sent = member.conn.vocab_blob
            await member.conn.set_vocab_mapping()
            if member.conn.vocab_blob is sent:  # not replaced while we were sending
                break
        if member.state in (JOINING, QUARANTINED):
            member.state = HEALTHY
            member.last_error = ""
            log.info("%s is healthy", member.url)
            self._start_member_task(member, self._heartbeats(member))
            self._notify()

    def _attach_p2p(self, conn: ServerConnection) -> None:
        """A point-to-point channel where the data path and the server's offer allow one."""
        mode = self.options.data_path
        try:
            offered_backend(conn.info, mode)
        except P2PUnavailable as exc:
            if mode != "p2p":  # "p2p" keeps the channel, which then fails loudly
                if conn.p2p is not None:
                    conn.p2p.reset(str(exc))
                conn.p2p = None
                return
        if conn.p2p is None:
            conn.p2p = P2PChannel(mode, timeout=self.options.request_timeout)

    async def _heartbeats(self, member: Member) -> None:
        """Keep our session alive on the server; a failed heartbeat quarantines the server."""
        while member.state == HEALTHY:
            await asyncio.sleep(self.options.heartbeat_interval)
            if member.state != HEALTHY:
                return
            try:
                await member.conn.heartbeat()
            except (ServerError, *TRANSIENT_ERRORS) as exc:
                self._quarantine(member, exc)
                return

    async def _refresh_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._resolve_now.wait(), self.options.resolve_interval)
            self._resolve_now.clear()
            started = loop.time()
            await self.refresh()
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
            if url not in urls and member.state != DRAINING:
                log.info("target server %s left DNS; draining", url)
                member.state = DRAINING
                if member.in_flight == 0:
                    self._retire(member)
        self._notify()

    def _retire(self, member: Member) -> None:
        if self.members.get(member.url) is member:
            del self.members[member.url]
        for task in member.tasks:
            task.cancel()
        self._spawn(self._disconnect(member))

    async def _disconnect(self, member: Member) -> None:
        with contextlib.suppress(ServerError, *TRANSIENT_ERRORS):
            member.conn.timeout = aiohttp.ClientTimeout(total=2.0)
            await member.conn.disconnect()

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _short(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
