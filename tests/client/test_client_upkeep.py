"""A member's upkeep (client/upkeep.py) on a real Membership whose connections and resolver are scripted
stand-ins: no servers and no network, so heartbeats and DNS refresh are each seen in milliseconds. The same
paths over real servers and a real DNS server are in test_client_discovery.py and test_client_membership.py."""

from __future__ import annotations

import asyncio
import logging

import dns.exception
import pytest

from eagle3_target.client import PoolOptions
from eagle3_target.client.members import Member, MemberState
from eagle3_target.client.membership import Membership

pytestmark = pytest.mark.timeout(30)

A, B, C = "http://127.0.0.1:9", "http://127.0.0.2:9", "http://127.0.0.3:9"


class Conn:
    """A server connection: heartbeats answer from ``beats`` in turn (an exception is raised), /health never
    answers (a member that joins stays JOINING), disconnects are recorded."""

    def __init__(self, url: str, *beats):
        self.url, self.beats, self.heartbeats, self.disconnects = url, list(beats), 0, []

    async def heartbeat(self) -> None:
        self.heartbeats += 1
        beat = self.beats.pop(0) if self.beats else None
        if isinstance(beat, BaseException):
            raise beat
        if callable(beat):
            beat()

    async def health(self):
        await asyncio.Event().wait()

    async def disconnect(self, timeout: float | None = None) -> None:
        self.disconnects.append(timeout)


class Resolver:
    """DNS answers in turn: a list of URLs, or an exception to raise; the last one repeats."""

    def __init__(self, *answers):
        self.answers, self.calls = list(answers), 0

    async def resolve(self) -> list[str]:
        self.calls += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer


def membership(*answers, **options) -> Membership:
    options = {"backoff_base": 3600.0, "heartbeat_interval": 0.001, **options}
    return Membership(Resolver(*answers or ([],)), Conn, PoolOptions(**options))


def member(roster: Membership, url: str, *beats, **fields) -> Member:
    roster.members[url] = found = Member(Conn(url, *beats), **{"state": MemberState.HEALTHY, **fields})
    return found


async def notifies(roster: Membership, action) -> bool:
    """Whether awaiting ``action()`` wakes a waiter on the membership's change condition (within 0.5 s)."""
    async with roster.changed:
        await action()
        return await roster.wait_changed(0.5)


# -- heartbeats ---------------------------------------------------------------------------------


async def test_heartbeats_go_on_while_healthy_and_a_failed_one_quarantines():
    roster = membership()
    found = member(roster, A, None, None, RuntimeError("session gone"))
    await asyncio.wait_for(roster._heartbeats(found), 5.0)
    assert found.conn.heartbeats == 3
    assert (found.state, found.strikes, found.last_error) == (
        MemberState.QUARANTINED,
        1,
        "RuntimeError: session gone",
    )
    await roster.close()


async def test_heartbeats_stop_when_the_member_leaves_health():
    roster = membership()
    found = member(roster, A)
    found.conn.beats = [lambda: setattr(found, "state", MemberState.DRAINING)]
    await asyncio.wait_for(roster._heartbeats(found), 5.0)
    assert found.conn.heartbeats == 1 and found.state == MemberState.DRAINING


async def test_no_heartbeat_after_the_member_left_health_during_the_wait():
    roster = membership(heartbeat_interval=0.05)
    found = member(roster, A)
    beating = asyncio.create_task(roster._heartbeats(found))
    await asyncio.sleep(0)  # it waits out the interval
    found.state = MemberState.QUARANTINED
    await asyncio.wait_for(beating, 5.0)
    assert found.conn.heartbeats == 0


async def test_the_interval_is_waited_before_each_heartbeat():
    roster = membership(heartbeat_interval=3600.0)
    found = member(roster, A)
    beating = asyncio.create_task(roster._heartbeats(found))
    await asyncio.sleep(0.05)
    assert found.conn.heartbeats == 0
    beating.cancel()


# -- DNS refresh ----------------------------------------------------------------------------------


async def test_new_addresses_join_and_forget_an_earlier_refusal(caplog):
    caplog.set_level(logging.INFO, "eagle3_target.client.membership")
    roster = membership([A, B])
    kept = member(roster, A)
    roster.refused[B] = "another model"
    assert await notifies(roster, roster.refresh)
    assert roster.members[A] is kept and roster.members[B].state == MemberState.JOINING
    assert roster.members[B].tasks and roster.refused == {}
    assert [r.getMessage() for r in caplog.records] == [f"new target server {B}"]
    await roster.close()


async def test_vanished_addresses_drain_and_idle_ones_retire_at_once(caplog):
    caplog.set_level(logging.INFO, "eagle3_target.client.membership")
    roster = membership([A])
    kept, busy, idle = member(roster, A), member(roster, B, in_flight=1), member(roster, C)
    await roster.refresh()
    await asyncio.gather(*roster._tasks)
    assert roster.members == {A: kept, B: busy}
    assert (kept.state, busy.state) == (MemberState.HEALTHY, MemberState.DRAINING)
    assert idle.conn.disconnects == [2.0] and busy.conn.disconnects == []
    await roster.refresh()  # a draining member is drained once
    left = [r.getMessage() for r in caplog.records if "left DNS" in r.getMessage()]
    assert left == [f"target server {B} left DNS; draining", f"target server {C} left DNS; draining"]
    await roster.close()


async def test_a_dns_failure_changes_nothing(caplog):
    failure = dns.exception.Timeout()
    roster = membership(failure)
    kept = member(roster, A)
    assert not await notifies(roster, roster.refresh)
    assert roster.members == {A: kept} and kept.state == MemberState.HEALTHY
    assert [r.getMessage() for r in caplog.records] == [
        f"re-resolving target endpoints failed (keeping 1 servers): {failure}"
    ]


async def test_the_refresh_loop_resolves_when_asked_and_outlives_any_failure(caplog):
    roster = membership(RuntimeError("resolver bug"), [A], resolve_interval=3600.0, min_resolve_gap=0.0)
    resolver = roster.resolver
    roster.spawn(roster._refresh_loop())
    for calls in (1, 2):
        roster.resolve_now.set()
        for _ in range(200):
            await asyncio.sleep(0.01)
            if resolver.calls == calls and not roster.resolve_now.is_set():
                break
        assert resolver.calls == calls
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "re-resolving target endpoints failed (keeping 0 servers): RuntimeError: resolver bug"
    ]
    assert list(roster.members) == [A]
    await roster.close()


async def test_the_refresh_loop_resolves_on_its_interval_at_most_once_per_gap():
    """Three resolutions take at least two gaps: a loaded machine only makes them later, never sooner."""
    roster = membership([A], resolve_interval=0.0, min_resolve_gap=0.1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    roster.spawn(roster._refresh_loop())
    while roster.resolver.calls < 3:
        assert loop.time() - started < 10, "the loop stopped resolving"
        await asyncio.sleep(0.01)
    assert loop.time() - started >= 0.2 * 0.95
    await roster.close()


async def test_the_gap_between_resolutions_counts_from_the_start_of_the_last(monkeypatch):
    real_sleep, waits = asyncio.sleep, []

    class Slow(Resolver):
        async def resolve(self) -> list[str]:
            await real_sleep(0.05)  # a resolution that takes time
            return await super().resolve()

    async def sleep(seconds):  # the loop's wait after its first resolution, recorded; it never ends
        waits.append(seconds)
        await asyncio.Event().wait()

    roster = membership(resolve_interval=0.0, min_resolve_gap=1.0)
    roster.resolver = Slow([])
    monkeypatch.setattr(asyncio, "sleep", sleep)
    roster.spawn(roster._refresh_loop())
    for _ in range(500):
        await real_sleep(0.01)
        if waits:
            break
    assert waits and waits[0] <= 0.95
    await roster.close()
