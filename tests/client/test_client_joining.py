"""Joining the pool (client/joining.py) on a real Membership and resolver whose server connections are
scripted stand-ins: no servers and no network, so the first wait, admission, retries, refusals and the vocab
mapping are each seen in milliseconds. The same paths over real servers are in test_client_membership.py,
test_client_waiting.py and test_client_faults.py."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest

from eagle3_target.client import PoolOptions
from eagle3_target.client import joining as joining_module
from eagle3_target.client.connection import RequestRejected, ServerError
from eagle3_target.client.endpoints import EndpointResolver, parse_specs
from eagle3_target.client.errors import BatchFailedError
from eagle3_target.client.identity import ModelMismatchError
from eagle3_target.client.members import Member, MemberState
from eagle3_target.client.membership import Membership
from eagle3_target.protocol import encodings
from eagle3_target.protocol.features import supervision_request
from eagle3_target.protocol.model_info import ModelInfo

pytestmark = pytest.mark.timeout(30)

A, B = "http://127.0.0.1:9", "http://127.0.0.2:9"
INFO = ModelInfo(8, 64, 512, (1, 3, 4))
OTHER_MODEL = ModelInfo(8, 64, 1024, (1, 3, 4))
HANG = "hang"


class Conn:
    """A server whose /health, /model_info and /set_vocab_mapping answer from scripts, each step in turn
    (the last one repeats): an exception is raised, HANG never answers, a callable is called."""

    def __init__(self, url: str, timeout: float | None, script: dict):
        self.url, self.timeout, self.script = url, timeout, {k: list(v) for k, v in script.items()}
        self.calls: list[str] = []
        self.blobs: list[bytes] = []

    async def _step(self, name: str, default):
        self.calls.append(name)
        steps = self.script.get(name, [default])
        step = steps.pop(0) if len(steps) > 1 else steps[0]
        if step == HANG:
            await asyncio.Event().wait()
        if isinstance(step, BaseException):
            raise step
        return step() if callable(step) else step

    async def health(self):
        return await self._step("health", (200, {"status": "ok"}))

    async def model_info(self):
        return await self._step("model_info", INFO)

    async def set_vocab_mapping(self, blob: bytes) -> None:
        self.blobs.append(blob)
        await self._step("set_vocab_mapping", None)

    async def heartbeat(self) -> None:
        await asyncio.Event().wait()

    async def disconnect(self, timeout: float | None = None) -> None:
        pass


class Fleet:
    """Connections by URL, each with its script; ``made`` records each connection asked for."""

    def __init__(self, **scripts):
        self.scripts, self.made = scripts, []

    def connect(self, url: str, timeout: float | None = None) -> Conn:
        self.made.append((url, timeout))
        return Conn(url, timeout, self.scripts.get(url, {}))


def membership(fleet: Fleet, urls=(A,), **options) -> Membership:
    options = {"backoff_base": 0.001, "backoff_max": 0.001, "heartbeat_interval": 3600.0, **options}
    resolver = EndpointResolver(parse_specs(",".join(urls)))
    return Membership(resolver, fleet.connect, PoolOptions(**options))


def scripts(**by_url) -> dict:
    return {{"a": A, "b": B}[name]: script for name, script in by_url.items()}


async def until(predicate, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.005)):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("timed out")


# -- start and the first wait ---------------------------------------------------------------------


async def test_start_checks_the_fleet_with_a_bounded_probe_and_returns_once_one_is_healthy():
    fleet = Fleet(**scripts(b={"health": [HANG]}))
    roster = membership(fleet, (A, B), request_timeout=30.0)
    await asyncio.wait_for(roster.start(), 5.0)
    assert [m.url for m in roster.healthy()] == [A] and roster.members[B].state == MemberState.JOINING
    assert fleet.made[:2] == [(A, 10.0), (B, 10.0)]  # the model probe: at most 10 s, or request_timeout
    assert fleet.made[2:] == [(A, None), (B, None)]
    assert roster.model.reference == INFO
    assert len(roster._tasks) >= 1  # the DNS refresh loop runs
    await roster.close()


async def test_start_resolves_until_its_deadline_on_the_pools_warning_schedule():
    asked = []

    class Resolver:
        async def resolve_until(self, deadline, options):
            asked.append((deadline - asyncio.get_running_loop().time(), options))
            return [A]

    roster = membership(Fleet(), start_timeout=40.0)
    roster.resolver = Resolver()
    await asyncio.wait_for(roster.start(), 5.0)
    ((left, options),) = asked
    assert 39.0 < left <= 40.0 and options is roster.options
    await roster.close()


async def test_the_model_probe_is_bounded_by_a_shorter_request_timeout():
    fleet = Fleet()
    roster = membership(fleet, request_timeout=3.0)
    await asyncio.wait_for(roster.start(), 5.0)
    assert fleet.made[0] == (A, 3.0)
    await roster.close()


async def test_the_probed_model_is_used_once_and_not_asked_again():
    fleet = Fleet()
    roster = membership(fleet)
    await asyncio.wait_for(roster.start(), 5.0)
    conn = roster.members[A].conn
    assert conn.calls == ["health"] and roster.members[A].probed_info is None
    await roster.close()


async def test_start_raises_the_refusal_when_every_server_is_refused():
    fleet = Fleet(**scripts(a={"health": [(404, {})]}, b={"model_info": [HANG, OTHER_MODEL]}))
    roster = membership(fleet, (A,))
    with pytest.raises(ServerError, match="HTTP 404 not_ready"):
        await asyncio.wait_for(roster.start(), 5.0)
    await roster.close()


async def test_start_fails_at_its_deadline_saying_why_each_server_is_not_ready(caplog):
    fleet = Fleet(**scripts(a={"health": [(503, {"status": "loading"})]}, b={"health": [(404, {})]}))
    roster = membership(fleet, (A, B), start_timeout=0.49, wait_log_interval=0.1)  # warns at 0.1 s and 0.3 s
    with pytest.raises(BatchFailedError) as failed:
        await asyncio.wait_for(roster.start(), 5.0)
    why = (
        f"{A} joining (ServerError: {A}/health: HTTP 503 loading: not ready); "
        f"{B} refused ({B}/health: HTTP 404 not_ready: not ready)"
    )
    assert str(failed.value) == f"no target server became ready within 0s: {why}"
    warnings = [r.getMessage() for r in caplog.records if "no target server ready after" in r.getMessage()]
    assert 1 <= len(warnings) <= 2
    assert set(warnings) == {f"no target server ready after 0s of 0s: {why}"}
    await roster.close()


# -- settle --------------------------------------------------------------------------------------


async def test_settle_waits_for_joiners_and_warns_about_the_unhealthy(caplog):
    fleet = Fleet(**scripts(b={"health": [HANG]}))
    roster = membership(fleet, (A, B))
    roster._add(A)
    roster._add(B)
    assert await roster.settle(0.2) == 1
    assert f"1 of 2 target servers healthy: {roster.describe()}" in [r.getMessage() for r in caplog.records]
    await roster.close()


async def test_settle_returns_at_once_when_none_is_joining(caplog):
    roster = membership(Fleet())
    roster._add(A)
    await until(lambda: roster.healthy())
    started = asyncio.get_running_loop().time()
    assert await roster.settle(5.0) == 1
    assert asyncio.get_running_loop().time() - started < 1.0 and "healthy:" not in caplog.text
    await roster.close()


# -- admission -----------------------------------------------------------------------------------


async def test_a_server_not_ready_is_retried_until_it_joins_with_the_mapping():
    fleet = Fleet(**scripts(a={"health": [(503, {}), aiohttp.ClientConnectionError("refused"), (200, {})]}))
    roster = membership(fleet)
    roster.vocab_blob = b"mapping"
    roster._add(A)
    await until(lambda: roster.healthy())
    found = roster.members[A]
    assert found.conn.calls == ["health", "health", "health", "model_info", "set_vocab_mapping"]
    assert found.conn.blobs == [b"mapping"] and found.last_error == "" and found.agreement.info == INFO
    assert len(found.tasks) == 1  # its heartbeats
    await roster.close()


@pytest.mark.parametrize(
    "script, why",
    [
        ({"health": [(401, {"status": "unauthorized"})]}, "HTTP 401 unauthorized"),
        ({"model_info": [OTHER_MODEL]}, f"{A} serves a different target"),
    ],
    ids=["4xx", "another-model"],
)
async def test_a_server_that_cannot_serve_us_is_refused_for_good(script, why, caplog):
    roster = membership(Fleet(**scripts(a=script)))
    roster.model.reference = INFO
    async with roster.changed:
        roster._add(A)
        assert await roster.wait_changed(2.0)
    found = roster.members[A]
    assert found.state == MemberState.REFUSED and why in found.last_error and why in roster.refused[A]
    assert isinstance(found.refusal, ServerError | ModelMismatchError)
    assert [r.getMessage() for r in caplog.records] == [f"refusing {A}: {found.refusal}"]
    await roster.close()


async def test_a_wrong_answer_quarantines_the_joiner_and_is_logged_once(caplog):
    broken = ValueError("not json")
    fleet = Fleet(**scripts(a={"model_info": [broken, broken, broken, INFO]}))
    roster = membership(fleet)
    async with roster.changed:
        roster._add(A)
        assert await roster.wait_changed(2.0)
        assert roster.members[A].state == MemberState.QUARANTINED
    await until(lambda: roster.healthy())
    assert [r.getMessage() for r in caplog.records if "cannot join" in r.getMessage()] == [
        f"{A} cannot join: ValueError: not json"
    ]
    await roster.close()


async def test_a_member_that_left_while_joining_is_not_admitted():
    fleet = Fleet()
    roster = membership(fleet)
    roster.vocab_blob = b"mapping"
    found = roster.members[A] = Member(fleet.connect(A))

    def drained():
        found.state = MemberState.DRAINING

    found.conn.script["set_vocab_mapping"] = [drained]
    await roster._admit(found)
    assert found.state == MemberState.DRAINING and found.agreement is None and not found.tasks


async def test_a_rejoin_waits_out_its_strikes_and_replaces_the_old_agreement():
    class Old:
        ended = 0

        def end(self):
            self.ended += 1

    fleet = Fleet()
    roster = membership(fleet, backoff_base=0.05, readmit_backoff_max=60.0)
    old = Old()
    found = roster.members[A] = Member(
        fleet.connect(A), state=MemberState.QUARANTINED, strikes=1, agreement=old
    )
    joining = asyncio.create_task(roster._join(found))
    await asyncio.sleep(0.1)
    assert found.conn.calls == []  # 0.05 x 4 = 0.2 s before it asks again
    await asyncio.wait_for(joining, 5.0)
    assert found.state == MemberState.HEALTHY and old.ended == 1
    await roster.close()


def test_the_readmission_delay_quadruples_with_each_strike_up_to_its_cap():
    roster = membership(Fleet(), backoff_base=0.5, readmit_backoff_max=20.0)
    assert [roster.readmit_delay(n) for n in (1, 2, 3)] == [2.0, 8.0, 20.0]


async def test_a_mapping_replaced_while_it_was_sent_is_sent_again():
    fleet = Fleet()
    roster = membership(fleet)
    roster.vocab_blob = b"first"
    found = roster.members[A] = Member(fleet.connect(A))

    def replaced():
        roster.vocab_blob = b"second" if roster.vocab_blob == b"first" else roster.vocab_blob

    found.conn.script["set_vocab_mapping"] = [replaced, None]
    await roster._admit(found)
    assert found.conn.blobs == [b"first", b"second"] and found.state == MemberState.HEALTHY
    await roster.close()


# -- the vocab mapping -----------------------------------------------------------------------------


async def healthy_pair(fleet: Fleet) -> Membership:
    roster = membership(fleet, (A, B))
    for url in (A, B):
        roster._add(url)
    await until(lambda: len(roster.healthy()) == 2)
    return roster


async def test_the_mapping_goes_to_every_healthy_server_and_a_failing_one_is_quarantined():
    fleet = Fleet(**scripts(b={"set_vocab_mapping": [aiohttp.ClientConnectionError("reset")]}))
    roster = await healthy_pair(fleet)
    await roster.set_vocab_mapping(b"mapping")
    assert roster.vocab_blob == b"mapping"
    assert [m.url for m in roster.healthy()] == [A] and roster.members[B].state == MemberState.QUARANTINED
    assert roster.members[B].last_error == "ClientConnectionError: reset"
    assert roster.members[A].conn.blobs[-1] == b"mapping"
    await roster.close()


async def test_a_mapping_every_server_refuses_is_rejected():
    no = ServerError(A, "set_vocab_mapping", 400, "bad_request", "ids out of range")
    nor = ServerError(B, "set_vocab_mapping", 403, "forbidden", "not yours")
    fleet = Fleet(**scripts(a={"set_vocab_mapping": [no]}, b={"set_vocab_mapping": [nor]}))
    roster = await healthy_pair(fleet)
    with pytest.raises(RequestRejected) as rejected:
        await roster.set_vocab_mapping(b"mapping")
    first = rejected.value
    assert (first.url, first.path, first.status, first.error, first.detail) == (
        A,
        "set_vocab_mapping",
        400,
        "bad_request",
        "ids out of range",
    )
    assert first.__cause__ is no
    await roster.close()


async def test_a_mapping_one_server_refuses_quarantines_only_that_one(caplog):
    caplog.set_level(logging.WARNING)
    no = ServerError(B, "set_vocab_mapping", 400, "bad_request", "no")
    fleet = Fleet(**scripts(b={"set_vocab_mapping": [no]}))
    roster = await healthy_pair(fleet)
    await roster.set_vocab_mapping(b"mapping")
    assert [m.url for m in roster.healthy()] == [A]
    await roster.close()


async def test_settle_waits_through_every_change_until_none_is_joining():
    fleet = Fleet(**scripts(b={"health": [(503, {}), (200, {})]}))
    roster = membership(fleet, (A, B))
    roster._add(A)
    roster._add(B)
    started = asyncio.get_running_loop().time()
    assert await roster.settle(5.0) == 2
    assert asyncio.get_running_loop().time() - started < 4.5  # woken by the joins, not by its 5 s timeout
    await roster.close()


async def test_a_joiner_not_up_yet_says_why_while_it_waits():
    fleet = Fleet(**scripts(a={"health": [aiohttp.ClientConnectionError("refused"), HANG]}))
    roster = membership(fleet)
    roster._add(A)
    found = roster.members[A]
    await until(lambda: len(found.conn.calls) == 2)
    assert (found.state, found.last_error) == (MemberState.JOINING, "ClientConnectionError: refused")
    await roster.close()


async def test_joining_backs_off_doubling_with_jitter_up_to_the_cap(monkeypatch):
    real_sleep, waits = asyncio.sleep, []

    async def sleep(seconds):
        waits.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(joining_module.random, "uniform", lambda low, high: low)
    monkeypatch.setattr(asyncio, "sleep", sleep)
    fleet = Fleet(**scripts(a={"health": [(503, {})] * 4 + [(200, {})]}))
    roster = membership(fleet, backoff_base=1.0, backoff_max=3.0)
    found = roster.members[A] = Member(fleet.connect(A))
    await roster._join(found)
    assert found.state == MemberState.HEALTHY and waits[:4] == [0.5, 1.0, 1.5, 1.5]
    await roster.close()


async def test_admission_makes_the_agreement_on_the_pools_terms(caplog):
    caplog.set_level(logging.INFO, "eagle3_target.client.membership")
    features = supervision_request(INFO.aux_layer_ids)
    roster = membership(Fleet(), data_path="p2p", request_timeout=7.0, features=features)
    roster._add(A)
    await until(lambda: roster.healthy())
    agreement = roster.members[A].agreement
    assert agreement.supervised and agreement.features == features
    assert (agreement.p2p.url, agreement.p2p.mode, agreement.p2p.timeout) == (A, "p2p", 7.0)
    assert f"{A} is healthy" in [r.getMessage() for r in caplog.records]
    await roster.close()


async def test_a_packing_job_refuses_a_server_that_cannot_pack():
    roster = membership(Fleet(), packing=True)
    roster._add(A)
    await until(lambda: roster.members[A].state == MemberState.REFUSED)
    assert isinstance(roster.members[A].refusal, encodings.EncodingError)
    assert roster.refused[A].startswith(f"{A} cannot compute packed rows")
    await roster.close()
