"""The pool's dispatch (client/dispatch.py) with a real Membership but no servers: each member is put in
HEALTHY by hand and each attempt is a coroutine the test writes, so failover, backpressure, refusals,
hedging, backoff and slot accounting are seen one at a time and in milliseconds. The same paths over real
servers are in test_client_failover.py and test_client_faults.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

import aiohttp
import pytest

from eagle3_target.client import PoolOptions
from eagle3_target.client import dispatch as dispatch_module
from eagle3_target.client import failover as failover_module
from eagle3_target.client.agreement import Agreement
from eagle3_target.client.connection import RequestRejected, ServerConnection, ServerError
from eagle3_target.client.dispatch import TargetPool
from eagle3_target.client.endpoints import EndpointResolver, parse_specs
from eagle3_target.client.errors import BatchFailedError
from eagle3_target.client.fetch import Reply
from eagle3_target.client.members import Member, MemberState
from eagle3_target.client.p2p import P2PUnavailable
from eagle3_target.protocol import encodings
from eagle3_target.protocol.features import Features
from eagle3_target.protocol.model_info import ModelInfo

pytestmark = pytest.mark.timeout(60)

# Nothing listens on these (port 9, discard); only closing the pool's sessions ever connects to them.
URLS = ["http://127.0.0.1:9", "http://127.0.0.2:9", "http://127.0.0.3:9"]
# A large backoff_base: a quarantined member waits readmit_backoff_max (an hour) before it tries to rejoin,
# so its state and last_error stay what dispatch made them; backoff_max keeps dispatch's own backoff at 2 ms.
FAST = dict(deadline=5.0, backoff_base=1000.0, backoff_max=0.002, readmit_backoff_max=3600.0)


@contextlib.asynccontextmanager
async def pool_of(count: int, **options):
    pool = TargetPool(EndpointResolver([]), "session", options=PoolOptions(**{**FAST, **options}))
    pool._http = aiohttp.ClientSession()
    pool._turn = -1  # the first pick is URLS[0]
    for url in URLS[:count]:
        pool.members[url] = Member(pool._connection(url), state=MemberState.HEALTHY)
    try:
        yield pool
    finally:
        await pool.close()


def members(pool: TargetPool) -> list[Member]:
    return list(pool.members.values())


def refusal(member: Member, status: int = 400, retry_after: float | None = None) -> ServerError:
    return ServerError(member.url, "generate", status, "bad_request", "no", retry_after=retry_after)


class Script:
    """An attempt per call: ``plan[url]`` lists what that server's successive attempts do (an exception
    to raise, "hang" to never answer, anything else to return); calls are recorded in order."""

    def __init__(self, **plan):
        self.plan, self.calls = {url: list(steps) for url, steps in plan.items()}, []

    async def __call__(self, member: Member):
        self.calls.append(member.url)
        step = self.plan[member.url].pop(0)
        if step == "hang":
            await asyncio.Event().wait()
        if isinstance(step, BaseException):
            raise step
        return step


async def test_start_joins_a_real_server_with_the_pools_timeouts_and_no_connection_cap(farm):
    url = farm.start("127.0.0.2")
    options = PoolOptions(request_timeout=7.0, start_timeout=30.0)
    pool = TargetPool(EndpointResolver(parse_specs(url)), "session", options=options)
    await pool.start()
    try:
        assert [m.url for m in pool.healthy()] == [url]
        # aiohttp's default connector holds at most 100 connections: requests, heartbeats and joins to a big
        # fleet would wait behind one another for a free one.
        assert pool._http.connector.limit == 0
        assert pool._connection(url).timeout.total == 7.0
        assert pool._connection(url, 2.0).timeout.total == 2.0  # a probe's own bound
    finally:
        await pool.close()


# -- picking a server ----------------------------------------------------------------------------


async def test_least_loaded_takes_the_idlest_free_server_and_skips_full_resting_and_refusing_ones():
    async with pool_of(3, max_in_flight=2) as pool:
        a, b, c = members(pool)
        a.in_flight, b.in_flight, c.in_flight = 1, 0, 1
        assert pool._pick() is b
        b.in_flight = 2  # full
        assert pool._pick() in (a, c)
        assert pool._pick({a.url}) is c  # a refused this request
        c.rest_until = asyncio.get_running_loop().time() + 60  # it answered 429 + Retry-After
        assert pool._pick() is a
        a.in_flight = 2
        assert pool._pick() is None
        c.rest_until = 0.0
        c.state = MemberState.QUARANTINED
        assert pool._pick() is None


@pytest.mark.parametrize("policy", ["least-loaded", "round-robin"])
async def test_ties_rotate_over_every_server(policy):
    async with pool_of(3, policy=policy) as pool:
        picks = [pool._pick().url for _ in range(30)]
        assert picks == URLS * 10  # in turn, in order


@pytest.mark.parametrize("policy", ["least-loaded", "round-robin"])
async def test_round_robin_ignores_load_and_least_loaded_avoids_it(policy):
    async with pool_of(3, policy=policy, max_in_flight=10) as pool:
        members(pool)[0].in_flight = 5
        counts = [0, 0, 0]
        for _ in range(30):
            counts[URLS.index(pool._pick().url)] += 1
        if policy == "round-robin":
            assert counts == [10, 10, 10]
        else:
            assert counts[0] == 0 and min(counts[1:]) > 0, counts


async def test_acquire_takes_a_slot_and_waits_for_a_released_one():
    async with pool_of(1, deadline=30.0, max_in_flight=2) as pool:
        (member,) = members(pool)
        loop = asyncio.get_running_loop()
        member.in_flight = 1
        assert await pool._acquire(loop.time() + 30) is member
        assert member.in_flight == 2
        waiter = asyncio.create_task(pool._acquire(loop.time() + 30))
        await asyncio.sleep(0.05)
        assert not waiter.done()  # max_in_flight 2: both slots are taken
        pool.membership.release(member)
        assert await asyncio.wait_for(waiter, 10) is member
        assert member.in_flight == 2


async def test_acquire_gives_up_at_its_deadline_and_wakes_when_a_rest_ends():
    async with pool_of(1) as pool:
        (member,) = members(pool)
        loop = asyncio.get_running_loop()
        member.in_flight = 1
        started = loop.time()
        assert await pool._acquire(started + 0.2) is None
        assert loop.time() - started >= 0.2
        member.in_flight, member.rest_until = 0, loop.time() + 0.2
        # No event will come: only the end of the rest can wake it, long before the 30 s deadline.
        assert await asyncio.wait_for(pool._acquire(loop.time() + 30), 10) is member


# -- failover --------------------------------------------------------------------------------------


async def test_an_answer_frees_the_slot_and_clears_the_servers_strikes():
    async with pool_of(1) as pool:
        (member,) = members(pool)
        member.strikes = 3
        assert await pool.with_failover(Script(**{member.url: ["ok"]}), what="/x") == "ok"
        assert (member.in_flight, member.strikes, pool.failovers) == (0, 0, 0)
        assert not pool._generate_seconds  # only hedged calls (/generate) are timed
        assert await pool.with_failover(Script(**{member.url: ["ok"]}), what="/generate", hedge=True) == "ok"
        assert len(pool._generate_seconds) == 1


async def test_a_server_fault_quarantines_that_server_and_moves_on():
    async with pool_of(2) as pool:
        a, b = members(pool)
        error = aiohttp.ClientConnectionError("gone")
        script = Script(**{a.url: [error], b.url: ["from b"]})
        assert await pool.with_failover(script, what="/x") == "from b"
        assert script.calls == [a.url, b.url]
        assert (a.state, b.state) == (MemberState.QUARANTINED, MemberState.HEALTHY)
        assert a.last_error == "ClientConnectionError: gone"
        assert pool.failovers == 1
        assert pool.membership.resolve_now.is_set()  # a lost connection: DNS is asked again soon
        assert a.in_flight == b.in_flight == 0


async def test_a_5xx_quarantines_without_asking_dns_again():
    async with pool_of(2) as pool:
        a, b = members(pool)
        script = Script(**{a.url: [refusal(a, 503)], b.url: ["from b"]})
        assert await pool.with_failover(script, what="/x") == "from b"
        assert a.state == MemberState.QUARANTINED
        assert not pool.membership.resolve_now.is_set()


async def test_no_server_left_fails_the_batch_at_the_deadline_naming_what_was_tried():
    async with pool_of(2, deadline=0.5) as pool:
        a, b = members(pool)
        script = Script(**{a.url: [refusal(a, 500)], b.url: [aiohttp.ClientConnectionError("reset")]})
        with pytest.raises(BatchFailedError) as failed:
            await pool.with_failover(script, what="/weights/lm_head")
        said = str(failed.value)
        assert said.startswith("/weights/lm_head found no server within 0s; tried: ")
        assert f"{a.url}: ServerError: {a.url}/generate: HTTP 500 bad_request: no" in said
        assert f"HTTP 500 bad_request: no; {b.url}: ClientConnectionError: reset. Servers now: " in said
        assert said.endswith(f"Servers now: {pool.describe_members()}")
        assert pool.failovers == 2


async def test_an_empty_pool_says_none_was_tried():
    async with pool_of(0, deadline=0.1) as pool:
        with pytest.raises(BatchFailedError, match=r"^/x found no server within 0s; tried: none\. "):
            await pool.with_failover(Script(), what="/x")


@pytest.mark.parametrize(
    "error",
    [
        BatchFailedError("caller"),
        RequestRejected("u", "p", 400, "e", "d"),
        P2PUnavailable("no p2p"),
        encodings.EncodingError("bad reply"),
    ],
    ids=lambda error: type(error).__name__,
)
async def test_the_callers_own_errors_are_raised_and_blame_no_server(error):
    async with pool_of(2) as pool:
        a, b = members(pool)
        with pytest.raises(type(error)) as raised:
            await pool.with_failover(Script(**{a.url: [error], b.url: ["unused"]}), what="/x")
        assert raised.value is error
        assert a.state == b.state == MemberState.HEALTHY
        assert pool.failovers == 0 and a.in_flight == 0


# -- refusals and backpressure --------------------------------------------------------------------


async def test_a_request_every_server_refuses_is_rejected_with_the_servers_words():
    async with pool_of(2, max_in_flight=2) as pool:
        a, b = members(pool)
        b.in_flight = 1  # busy with another request: a, the idler, is asked first, and not again
        script = Script(**{a.url: [refusal(a, 413)], b.url: [refusal(b, 413)]})
        with pytest.raises(RequestRejected) as rejected:
            await pool.with_failover(script, what="/x")
        got = rejected.value
        assert (got.url, got.path, got.status, got.error, got.detail) == (
            b.url,
            "generate",
            413,
            "bad_request",
            "no",
        )
        assert script.calls == [a.url, b.url]  # each asked once
        assert a.state == b.state == MemberState.HEALTHY  # the request was at fault, not the servers
        assert pool.failovers == 0


async def test_servers_refusing_what_another_serves_are_quarantined():
    async with pool_of(3, max_in_flight=2) as pool:
        a, b, c = members(pool)
        c.in_flight = 1  # busy with another request: asked last
        script = Script(**{a.url: [refusal(a, 400)], b.url: [refusal(b, 400)], c.url: ["from c"]})
        assert await pool.with_failover(script, what="/x") == "from c"
        assert a.state == b.state == MemberState.QUARANTINED
        assert a.last_error == b.last_error == f"ServerFault: refused a request {c.url} served"
        assert pool.failovers == 2


async def test_a_429_with_retry_after_rests_the_server_and_retries_it_after_the_rest():
    async with pool_of(1, deadline=30.0) as pool:
        (member,) = members(pool)
        loop = asyncio.get_running_loop()
        started = loop.time()
        script = Script(**{member.url: [refusal(member, 429, retry_after=0.3), "after rest"]})
        assert await pool.with_failover(script, what="/x") == "after rest"
        assert loop.time() - started >= 0.3
        assert member.state == MemberState.HEALTHY and pool.failovers == 0
        assert member.in_flight == 0


async def test_a_429_without_retry_after_is_a_busy_server_failed_over():
    async with pool_of(2) as pool:
        a, b = members(pool)
        assert await pool.with_failover(Script(**{a.url: [refusal(a, 429)], b.url: ["b"]}), what="/x") == "b"
        assert a.state == MemberState.QUARANTINED and pool.failovers == 1


# -- backoff ---------------------------------------------------------------------------------------


class RecordedSleeps:
    """dispatch's asyncio with sleep recorded (and not slept): the backoff between failed rounds."""

    def __init__(self):
        self.delays = []

    def __getattr__(self, name):
        return getattr(asyncio, name)

    async def sleep(self, delay):
        self.delays.append(delay)
        await asyncio.sleep(0)


@pytest.mark.parametrize("draw", [1.0, 0.5])
async def test_rounds_back_off_exponentially_with_jitter_up_to_the_cap(monkeypatch, draw):
    sleeps, bounds = RecordedSleeps(), []
    monkeypatch.setattr(failover_module, "asyncio", sleeps)
    monkeypatch.setattr(random, "uniform", lambda low, high: bounds.append((low, high)) or draw)
    async with pool_of(1, deadline=30.0, backoff_base=0.1, backoff_max=0.5) as pool:
        (member,) = members(pool)
        busy = [refusal(member, 429, retry_after=0.0)] * 5  # backpressure: the server stays healthy
        assert await pool.with_failover(Script(**{member.url: [*busy, "ok"]}), what="/x") == "ok"
    assert sleeps.delays == pytest.approx([d * draw for d in (0.1, 0.2, 0.4, 0.5, 0.5)])
    assert bounds == [(0.5, 1.0)] * 5


async def test_backoff_never_sleeps_past_the_deadline():
    async with pool_of(1, deadline=0.5, backoff_base=100.0, backoff_max=100.0) as pool:
        (member,) = members(pool)
        loop = asyncio.get_running_loop()
        started, script = loop.time(), Script(**{member.url: [refusal(member, 429, 0.0)] * 100})
        with pytest.raises(BatchFailedError, match=r"found no server within 0s; tried: \S+: ServerError"):
            await pool.with_failover(script, what="/x")
        assert loop.time() - started < 10  # not the 50-100 s the backoff asked for
        assert script.calls == [member.url]  # one try, one backoff to the deadline, none past it
        assert member.in_flight == 0


# -- hedging ---------------------------------------------------------------------------------------


def test_the_hedge_threshold_is_the_floor_or_a_multiple_of_the_p99():
    pool = TargetPool(EndpointResolver([]), "s", options=PoolOptions(hedge_after=1.0, hedge_p99_factor=3.0))
    assert pool.hedge_threshold() == 1.0  # no samples yet
    pool._generate_seconds.extend(i / 100 for i in range(100))
    assert pool.hedge_threshold() == pytest.approx(3.0 * 0.98)  # p99 of 0.00 ... 0.99
    pool._generate_seconds.clear()
    pool._generate_seconds.extend([0.1] * 50)
    assert pool.hedge_threshold() == 1.0  # fast answers never lower it below the floor
    pool._generate_seconds.extend([10.0] * 1000 + [0.5] * 1000)
    assert pool.hedge_threshold() == 1.5  # only the last 1,000 answers count: the slow phase is over


async def test_a_pool_never_started_closes_quietly():
    await TargetPool(EndpointResolver([]), "s").close()


async def test_a_silent_server_is_hedged_onto_another_and_the_first_answer_wins(caplog):
    async with pool_of(2, hedge_after=0.2, deadline=30.0) as pool:
        a, b = members(pool)
        script = Script(**{a.url: ["hang"], b.url: ["from b"]})
        with caplog.at_level(logging.WARNING, logger=dispatch_module.__name__):
            assert await pool.with_failover(script, what="/generate", hedge=True) == "from b"
        assert pool.hedges == 1 and a.state == MemberState.QUARANTINED
        assert a.last_error == "TimeoutError: silent for 0.2s on /generate"
        assert a.in_flight == b.in_flight == 0  # the hedged-away attempt was cancelled and released
        assert [r.getMessage() for r in caplog.records if r.name == dispatch_module.__name__] == [
            f"{a.url} has not answered /generate for 0.2s; marking it unhealthy until /health answers, "
            "re-sending the request to another server"
        ]
        assert len(pool._generate_seconds) == 1  # the answer's time feeds the threshold


async def test_with_no_free_server_a_hedge_keeps_waiting_for_the_slow_answer():
    async with pool_of(1, hedge_after=0.1, deadline=30.0) as pool:
        (member,) = members(pool)

        async def slow(m):
            await asyncio.sleep(0.5)
            return "late but whole"

        assert await pool.with_failover(slow, what="/generate", hedge=True) == "late but whole"
        assert pool.hedges == 0 and member.state == MemberState.QUARANTINED
        assert member.in_flight == 0


async def test_an_unhedged_call_to_a_silent_server_fails_at_the_deadline():
    async with pool_of(1, hedge_after=0.05, deadline=0.5) as pool:
        (member,) = members(pool)
        with pytest.raises(BatchFailedError, match=f"^/x got no answer within 0s from {member.url}$"):
            await pool.with_failover(Script(**{member.url: ["hang"]}), what="/x")
        assert member.state == MemberState.HEALTHY and member.in_flight == 0


async def test_unhedged_calls_wait_out_a_slow_server():
    async with pool_of(2, hedge_after=0.05, deadline=30.0) as pool:
        a, b = members(pool)

        async def slow(m):
            await asyncio.sleep(0.3)
            return m.url

        assert await pool.with_failover(slow, what="/weights/x") == a.url
        assert pool.hedges == 0 and a.state == b.state == MemberState.HEALTHY


async def test_silence_until_the_deadline_fails_the_batch_and_cancels_every_attempt():
    async with pool_of(2, hedge_after=0.1, deadline=0.6) as pool:
        a, b = members(pool)
        script = Script(**{a.url: ["hang"], b.url: ["hang"]})
        with pytest.raises(BatchFailedError) as failed:
            await pool.with_failover(script, what="/generate", hedge=True)
        assert str(failed.value) == f"/generate got no answer within 1s from {a.url}, {b.url}"
        assert a.in_flight == b.in_flight == 0


async def test_every_silent_server_is_hedged_in_turn_and_slots_are_counted_not_set():
    async with pool_of(3, hedge_after=0.2, deadline=30.0, max_in_flight=2) as pool:
        a, b, c = members(pool)
        c.in_flight = 1  # it runs another request of this job: hedged onto last
        script = Script(**{a.url: ["hang"], b.url: ["hang"], c.url: ["from c"]})
        assert await pool.with_failover(script, what="/generate", hedge=True) == "from c"
        assert script.calls == [a.url, b.url, c.url] and pool.hedges == 2
        assert (a.in_flight, b.in_flight, c.in_flight) == (0, 0, 1)  # the other request keeps its slot


async def test_a_capture_is_a_hedged_generate_with_the_jobs_mapping_shape_and_features(monkeypatch, caplog):
    # each member's agreement holds the feature request it was admitted for
    features = Features(layers=(1,))
    captured = Reply("nemo", {}, features=features)
    calls = []

    async def fetch_capture(conn, agreement, request, shape, blob, features):
        calls.append((conn.url, agreement, request, shape, blob, features))
        if len(calls) == 1:
            await asyncio.Event().wait()  # the first server is silent
        return captured

    monkeypatch.setattr(dispatch_module, "fetch_capture", fetch_capture)
    async with pool_of(2, hedge_after=0.2, deadline=5.0) as pool:
        a, b = members(pool)
        for member in (a, b):
            member.agreement = Agreement(ModelInfo(8, 64, 512, (1, 3, 4)), features=features)
        pool.membership.vocab_blob = b"mapping"
        assert await pool.capture(b"request", 2, 16, 96) is captured
    assert calls == [(m.url, m.agreement, b"request", (2, 16, 96), b"mapping", features) for m in (a, b)]
    assert pool.hedges == 1
    assert f"{a.url} has not answered /generate for 0.2s" in caplog.text


# -- the calls a trainer makes -------------------------------------------------------------------


def agreed(pool: TargetPool, **terms) -> None:
    for member in members(pool):
        member.agreement = Agreement(ModelInfo(8, 64, 512, (1, 3, 4)), **terms)


async def test_connections_carry_the_pools_session_token_and_priority():
    options = PoolOptions(priority="low")
    pool = TargetPool(EndpointResolver([]), "job-7", auth_token="secret", options=options)
    async with aiohttp.ClientSession() as pool._http:
        conn = pool._connection(URLS[0])
    assert conn.headers == {
        "X-Eagle3-Session": "job-7",
        "Authorization": "Bearer secret",
        "X-Eagle3-Priority": "low",
    }


@pytest.mark.parametrize("capture", [False, True], ids=["generate", "supervised-capture"])
async def test_supervision_is_a_hedged_generate_with_the_jobs_mapping_and_shape(monkeypatch, caplog, capture):
    calls = []

    async def fetch_supervision(conn, agreement, request, shape, blob):
        calls.append((conn.url, agreement, request, shape, blob))
        if len(calls) == 1:
            await asyncio.Event().wait()  # the first server is silent
        return dispatch_module.Reply(encodings.NEMO, {})

    monkeypatch.setattr(dispatch_module, "fetch_supervision", fetch_supervision)
    async with pool_of(2, hedge_after=0.2) as pool:
        agreed(pool, supervised=True)
        a, b = members(pool)
        pool.membership.vocab_blob = b"mapping"
        call = pool.capture if capture else pool.generate
        assert await call(b"request", 2, 16, 96) == dispatch_module.Reply(encodings.NEMO, {})
    assert calls == [(m.url, m.agreement, b"request", (2, 16, 96), b"mapping") for m in (a, b)]
    assert pool.hedges == 1 and f"{a.url} has not answered /generate for 0.2s" in caplog.text


async def test_a_hidden_reply_gets_the_head_rows_fetched_once_per_mapping_and_target_version(monkeypatch):
    fetched, served = [], {"version": None}

    async def fetch_supervision(conn, agreement, request, shape, blob):
        return dispatch_module.Reply(encodings.HIDDEN, {}, target_version=served["version"])

    async def fetch_lm_head(conn, agreement, draft_vocab, version):
        fetched.append((conn.url, agreement, draft_vocab, version))
        return len(fetched)

    monkeypatch.setattr(dispatch_module, "fetch_supervision", fetch_supervision)
    monkeypatch.setattr(dispatch_module, "fetch_lm_head", fetch_lm_head)
    async with pool_of(1) as pool:
        agreed(pool)
        (member,) = members(pool)
        pool.membership.vocab_blob = b"first"
        for _ in range(2):
            assert (await pool.generate(b"request", 2, 16, 96)).head_rows == 1
        pool.membership.vocab_blob = b"second"
        assert (await pool.generate(b"request", 2, 16, 96)).head_rows == 2
        member.version = served["version"] = "v2"  # refreshed: the rows are of other weights
        assert (await pool.generate(b"request", 2, 16, 96)).head_rows == 3
    assert fetched == [(member.url, member.agreement, 96, v) for v in (None, None, "v2")]


async def test_weights_and_embeddings_fail_over_and_name_what_was_asked(monkeypatch):
    asked = []

    async def fetch_weight(conn, agreement, name):
        asked.append((conn.url, agreement, name))
        raise aiohttp.ClientConnectionError("reset")

    async def fetch_input_embeddings(conn, agreement):
        asked.append((conn.url, agreement))
        raise aiohttp.ClientConnectionError("reset")

    monkeypatch.setattr(dispatch_module, "fetch_weight", fetch_weight)
    monkeypatch.setattr(dispatch_module, "fetch_input_embeddings", fetch_input_embeddings)
    async with pool_of(1, deadline=0.2) as pool:
        agreed(pool)
        (member,) = members(pool)
        with pytest.raises(BatchFailedError, match=r"^/weights/lm_head found no server"):
            await pool.weight("lm_head")
        member.state = MemberState.HEALTHY  # back from its quarantine
        with pytest.raises(BatchFailedError, match=r"^/input_embeddings found no server"):
            await pool.input_embeddings()
    assert asked == [(member.url, member.agreement, "lm_head"), (member.url, member.agreement)]


async def test_the_mapping_is_the_memberships():
    async with pool_of(0) as pool:
        await pool.set_vocab_mapping(b"mapping")
        assert pool.membership.vocab_blob == b"mapping"


async def test_settle_counts_the_healthy_servers():
    async with pool_of(2) as pool:
        assert await pool.settle(0.1) == 2


async def test_a_fresh_pool_picks_from_its_first_turn():
    pool = TargetPool(EndpointResolver([]), "session", options=PoolOptions(**FAST))
    pool.members[URLS[0]] = Member(ServerConnection(URLS[0], None, "session"), state=MemberState.HEALTHY)
    assert pool._pick() is pool.members[URLS[0]]


async def test_a_rest_ending_now_is_over_and_a_deadline_reached_now_is_past(monkeypatch):
    async with pool_of(1) as pool:
        (member,) = members(pool)
        member.rest_until = 100.0
        with monkeypatch.context() as clock:
            clock.setattr(asyncio.get_running_loop(), "time", lambda: 100.0)
            assert pool._pick() is member
            assert await pool._acquire(deadline=100.0) is None


async def test_a_timed_call_records_how_long_it_took():
    async with pool_of(1) as pool:
        (member,) = members(pool)
        await pool.with_failover(Script(**{member.url: ["ok"]}), what="/generate", hedge=True)
        (seconds,) = pool._generate_seconds
        assert 0.0 <= seconds < 5.0


async def test_the_servers_are_described_with_their_states_and_refusals():
    async with pool_of(0) as pool:
        assert pool.describe_members() == "no servers"
    async with pool_of(2) as pool:
        a, b = members(pool)
        b.state, b.last_error = MemberState.QUARANTINED, "TimeoutError"
        pool.membership.refused.update({URLS[1]: "stale", URLS[2]: "another model"})
        assert pool.describe_members() == (
            f"{a.url} healthy; {b.url} quarantined (TimeoutError); {URLS[2]} refused (another model)"
        )
