"""Leaving dispatch (client/quarantine.py) on a real Membership whose connections are scripted stand-ins: no
servers and no network, so quarantine, rest, release, retirement and close are each seen in milliseconds.
The same paths over real servers are in test_client_faults.py and test_client_failover.py."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest

from eagle3_target.client import PoolOptions
from eagle3_target.client.connection import ServerError
from eagle3_target.client.endpoints import EndpointResolver
from eagle3_target.client.members import Member, MemberState
from eagle3_target.client.membership import Membership

pytestmark = pytest.mark.timeout(30)

URL, OTHER = "http://127.0.0.1:9", "http://127.0.0.2:9"


class Conn:
    """A server connection that answers nothing: it records disconnects and raises ``fail`` from them."""

    def __init__(self, url: str, fail: BaseException | None = None):
        self.url, self.fail, self.disconnects = url, fail, []

    async def disconnect(self, timeout: float | None = None) -> None:
        self.disconnects.append(timeout)
        if self.fail is not None:
            raise self.fail


class Ending:
    """An agreement that records its end."""

    ended = 0

    def end(self) -> None:
        self.ended += 1


def membership(**options) -> Membership:
    # backoff_base of an hour: a quarantined member's rejoin waits, so the test sees the state it was left in
    return Membership(EndpointResolver([]), Conn, PoolOptions(**{"backoff_base": 3600.0, **options}))


def member(roster: Membership, url: str = URL, **fields) -> Member:
    roster.members[url] = found = Member(Conn(url), **{"state": MemberState.HEALTHY, **fields})
    return found


async def notifies(roster: Membership, action) -> bool:
    """Whether ``action`` wakes a waiter on the membership's change condition (within half a second)."""
    async with roster.changed:
        action()
        return await roster.wait_changed(0.5)


async def settled(roster: Membership) -> None:
    await asyncio.gather(*roster._tasks, return_exceptions=True)


async def test_quarantine_takes_a_healthy_member_out_and_starts_its_rejoin(caplog):
    roster = membership()
    found = member(roster)
    assert await notifies(roster, lambda: roster.quarantine(found, RuntimeError("stalled")))
    assert (found.state, found.strikes, found.last_error) == (
        MemberState.QUARANTINED,
        1,
        "RuntimeError: stalled",
    )
    assert len(found.tasks) == 1  # the rejoin, waiting out its readmission delay
    assert roster.healthy() == []
    assert [r.getMessage() for r in caplog.records] == [f"quarantining {URL}: RuntimeError: stalled"]
    await roster.close()


async def test_each_quarantine_is_one_more_strike():
    roster = membership()
    found = member(roster, strikes=2)
    roster.quarantine(found, RuntimeError("stalled"))
    assert found.strikes == 3
    await roster.close()


@pytest.mark.parametrize("state", [MemberState.QUARANTINED, MemberState.DRAINING, MemberState.JOINING])
async def test_quarantine_of_a_member_not_healthy_only_records_why(state):
    roster = membership()
    found = member(roster, state=state, strikes=2)
    assert not await notifies(roster, lambda: roster.quarantine(found, RuntimeError("again")))
    assert (found.state, found.strikes, found.last_error) == (state, 2, "RuntimeError: again")
    assert not found.tasks
    await roster.close()


async def test_rest_keeps_a_member_healthy_and_logs_once_per_rest(caplog):
    caplog.set_level(logging.INFO, "eagle3_target.client.membership")
    roster = membership()
    found = member(roster)
    now = asyncio.get_running_loop().time()
    assert await notifies(roster, lambda: roster.rest(found, 30.0))
    assert now + 30.0 <= found.rest_until <= asyncio.get_running_loop().time() + 30.0
    roster.rest(found, 60.0)  # while resting: a longer rest, no second line
    assert found.rest_until >= now + 60.0
    assert found.state == MemberState.HEALTHY
    assert [r.getMessage() for r in caplog.records] == [f"{URL} asks us to wait 30.0s (429)"]
    await roster.close()


async def test_rest_after_the_last_one_ended_logs_again(caplog, monkeypatch):
    caplog.set_level(logging.INFO, "eagle3_target.client.membership")
    roster = membership()
    found = member(roster, rest_until=100.0)
    with monkeypatch.context() as clock:
        clock.setattr(asyncio.get_running_loop(), "time", lambda: 100.0)  # the last rest ends now
        roster.rest(found, 1.0)
    assert len(caplog.records) == 1 and found.rest_until == 101.0
    await roster.close()


async def test_release_frees_a_slot_and_keeps_a_healthy_member():
    roster = membership()
    found = member(roster, in_flight=2)
    assert await notifies(roster, lambda: roster.release(found))
    assert found.in_flight == 1 and roster.members == {URL: found}
    roster.release(found)
    assert found.in_flight == 0 and roster.members == {URL: found} and found.conn.disconnects == []
    await roster.close()


async def test_release_retires_a_draining_member_with_its_last_request():
    roster = membership()
    found = member(roster, state=MemberState.DRAINING, in_flight=2, agreement=Ending())
    roster.release(found)
    await settled(roster)
    assert roster.members == {URL: found} and found.conn.disconnects == []  # one request still running
    task = asyncio.create_task(asyncio.Event().wait())
    found.tasks.add(task)
    assert await notifies(roster, lambda: roster.release(found))
    await settled(roster)
    assert roster.members == {} and found.conn.disconnects == [2.0] and found.agreement.ended == 1
    assert task.cancelled()


async def test_retiring_leaves_a_new_member_at_the_same_address():
    roster = membership()
    old = member(roster, state=MemberState.DRAINING, in_flight=1)
    new = member(roster)  # DNS listed the address again: a new member took the URL
    roster.release(old)
    await settled(roster)
    assert roster.members == {URL: new} and old.conn.disconnects == [2.0] and new.conn.disconnects == []
    await roster.close()


@pytest.mark.parametrize(
    "fail",
    [ServerError(URL, "disconnect", 500, "internal", "no"), aiohttp.ClientConnectionError("gone")],
    ids=["server-error", "transient"],
)
async def test_a_failed_disconnect_is_ignored(fail):
    roster = membership()
    found = Member(Conn(URL, fail), state=MemberState.DRAINING)
    await roster._disconnect(found)  # no agreement to end, and the error is swallowed
    assert found.conn.disconnects == [2.0]


async def test_any_other_disconnect_failure_is_raised():
    roster = membership()
    with pytest.raises(ValueError):
        await roster._disconnect(Member(Conn(URL, ValueError("bug")), state=MemberState.DRAINING))


async def test_close_stops_every_task_and_ends_every_session():
    roster = membership()
    first, second = member(roster, agreement=Ending()), member(roster, OTHER)
    roster.quarantine(first, RuntimeError("x"))  # a member task: its rejoin
    roster.spawn(asyncio.Event().wait())  # a pool task
    tasks = [*roster._tasks, *first.tasks]
    await roster.close()
    assert all(task.done() for task in tasks)
    assert roster.members == {}
    assert first.conn.disconnects == second.conn.disconnects == [2.0] and first.agreement.ended == 1


async def test_close_waits_for_tasks_slow_to_stop_and_survives_a_failed_disconnect():
    roster = membership()
    failing, other = member(roster), member(roster, OTHER)
    failing.conn.fail = ValueError("bug")

    async def slow_to_stop():
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.05)

    roster.spawn(slow_to_stop())
    (task,) = roster._tasks
    await asyncio.sleep(0)  # it starts, so cancelling it runs its finally
    await roster.close()
    assert task.done() and roster.members == {}
    assert failing.conn.disconnects == other.conn.disconnects == [2.0]
