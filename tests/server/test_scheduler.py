"""Fair turns at the model (server/scheduler.py), driven directly: who is served in which order.

Each lane is one session's client: it keeps ``depth`` requests waiting for a turn and logs each turn
it gets. Nothing sleeps: the event loop's order is deterministic, so the logs are too.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram

from eagle3_target.server.errors import Forbidden, InvalidInput, QueueFull
from eagle3_target.server.scheduler import FairScheduler, priority_class


async def lanes(scheduler: FairScheduler, spec: dict[str, tuple[int, int, str]], turns: int) -> list[str]:
    """Sessions name -> (requests in flight, tokens each, priority); the first ``turns`` turns, in order."""
    log: list[str] = []
    enough = asyncio.Event()

    async def request(name: str, tokens: int, priority: str) -> None:
        async with scheduler.turn(name, tokens, priority):
            log.append(name)
            if len(log) >= turns:
                enough.set()
            await asyncio.sleep(0)  # the turn spans an await, as a forward on the model thread does

    async def lane(name: str, depth: int, tokens: int, priority: str) -> None:
        async def client() -> None:  # one request in flight: the next is sent when the last returns
            while not enough.is_set():
                await request(name, tokens, priority)

        await asyncio.gather(*(client() for _ in range(depth)))

    tasks = [asyncio.create_task(lane(name, *s)) for name, s in spec.items()]
    await enough.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return log[:turns]


async def test_a_greedy_session_takes_turns_with_polite_ones():
    log = await lanes(
        FairScheduler(), {"greedy": (8, 64, "normal"), "a": (1, 64, "normal"), "b": (1, 64, "normal")}, 300
    )
    counts = Counter(log[30:])  # past the start, where greedy's first eight arrive before a and b
    assert counts["greedy"] == counts["a"] == counts["b"] == 90


async def test_first_come_first_served_would_fail_the_same_check():
    """The check above holds the greedy session to its share: served in arrival order, it takes eight
    turns for each of the others' one (what issue 32 measured)."""
    scheduler = FairScheduler()
    scheduler._finish = _Forgetful()  # every request starts at the current virtual time: arrival order
    counts = Counter(
        (
            await lanes(
                scheduler, {"greedy": (8, 64, "normal"), "a": (1, 64, "normal"), "b": (1, 64, "normal")}, 300
            )
        )[30:]
    )
    assert counts["greedy"] >= 7 * counts["a"]


class _Forgetful(dict):
    def get(self, key, default=None):
        return default


async def test_shares_are_by_tokens_not_requests():
    log = await lanes(FairScheduler(), {"long": (4, 300, "normal"), "short": (4, 100, "normal")}, 400)
    counts = Counter(log[8:])
    assert counts["short"] == pytest.approx(3 * counts["long"], abs=3)


async def test_priority_classes_weigh_the_shares():
    spec = {"high": (4, 64, "high"), "normal": (4, 64, "normal"), "low": (4, 64, "low")}
    counts = Counter((await lanes(FairScheduler(), spec, 712))[12:])
    assert counts["high"] == pytest.approx(2 * counts["normal"], abs=2)
    assert counts["normal"] == pytest.approx(2 * counts["low"], abs=2)


async def test_a_session_alone_is_served_back_to_back():
    scheduler = FairScheduler()
    log = await lanes(scheduler, {"alone": (8, 64, "normal")}, 50)
    assert log == ["alone"] * 50
    assert scheduler.waiting == 0 and not scheduler._busy  # the model is free again, nothing left queued


async def test_past_its_cap_a_session_gets_queue_full_and_others_still_queue():
    scheduler = FairScheduler(max_queued_per_session=2)
    hold = asyncio.Event()

    async def request(name: str) -> None:
        async with scheduler.turn(name, 10):
            await hold.wait()

    running = [asyncio.create_task(request("greedy")) for _ in range(3)]  # one computes, two wait
    await asyncio.sleep(0)
    assert scheduler.queued("greedy") == 2
    with pytest.raises(QueueFull) as refused:
        async with scheduler.turn("greedy", 10):
            pass
    assert refused.value.error == "too_many_queued" and refused.value.retry_after >= 1
    assert "--max-queued-per-session 2" in refused.value.detail
    running.append(asyncio.create_task(request("polite")))
    await asyncio.sleep(0)
    assert scheduler.queued("polite") == 1
    hold.set()
    await asyncio.gather(*running)
    assert scheduler.waiting == 0


async def test_a_request_cancelled_while_queued_or_as_it_is_handed_the_turn_frees_it():
    scheduler = FairScheduler()
    hold = asyncio.Event()
    served = []

    async def request(name: str) -> None:
        async with scheduler.turn(name, 10):
            served.append(name)
            await hold.wait()

    async def first() -> None:
        await request("a")
        handed.cancel()  # a's turn was just handed to c, which has not run yet: it must pass it on

    tasks = [asyncio.create_task(first())]
    queued = asyncio.create_task(request("b"))
    handed = asyncio.create_task(request("c"))
    tasks.append(asyncio.create_task(request("d")))
    await asyncio.sleep(0)
    queued.cancel()  # cancelled while waiting: skipped
    await asyncio.sleep(0)
    assert scheduler.waiting == 2
    hold.set()
    await asyncio.gather(*tasks)
    assert queued.cancelled() and handed.cancelled()
    assert served == ["a", "d"]
    assert scheduler.waiting == 0 and not scheduler._busy


async def test_queue_depth_and_wait_are_counted_by_priority_class():
    registry = CollectorRegistry()
    queued = Gauge("q", "", ["priority"], registry=registry)
    wait = Histogram("w", "", ["priority"], registry=registry)
    scheduler = FairScheduler(queued=queued, wait_seconds=wait)
    hold = asyncio.Event()

    async def request(priority: str) -> None:
        async with scheduler.turn(priority, 10, priority):
            await hold.wait()

    tasks = [asyncio.create_task(request(p)) for p in ("normal", "high", "high")]
    await asyncio.sleep(0)
    assert registry.get_sample_value("q", {"priority": "high"}) == 2
    assert registry.get_sample_value("q", {"priority": "normal"}) == 0  # its request computes
    hold.set()
    await asyncio.gather(*tasks)
    assert registry.get_sample_value("q", {"priority": "high"}) == 0
    assert registry.get_sample_value("w_count", {"priority": "high"}) == 2
    assert registry.get_sample_value("w_count", {"priority": "normal"}) == 1


def test_priority_class_is_one_of_three_and_bounded_by_the_server():
    assert priority_class(None, "normal") == "normal"
    assert priority_class(" Low ", "normal") == "low"
    assert priority_class("high", "high") == "high"
    with pytest.raises(Forbidden) as refused:
        priority_class("high", "normal")
    assert (refused.value.error, refused.value.detail) == (
        "priority_not_allowed",
        "this server grants priority up to 'normal', not 'high'",
    )
    with pytest.raises(InvalidInput) as refused:
        priority_class("urgent", "high")
    assert (refused.value.error, refused.value.detail) == (
        "invalid_priority",
        "priority 'urgent' is not one of low, normal, high",
    )


async def _holding(scheduler: FairScheduler, session: str, served: list[str] | None = None):
    """A request that takes its turn and holds it until the returned event is set."""
    done = asyncio.Event()

    async def request() -> None:
        async with scheduler.turn(session, 10):
            if served is not None:
                served.append(session)
            await done.wait()

    task = asyncio.create_task(request())
    await asyncio.sleep(0)
    return task, done


async def _refused(scheduler: FairScheduler, session: str) -> QueueFull:
    with pytest.raises(QueueFull) as refused:
        async with scheduler.turn(session, 10):
            pass
    return refused.value


async def test_retry_after_is_the_mean_turn_times_the_requests_ahead():
    """Retry-After: the moving mean of a turn's length (the first turn as it was, then each new one weighing
    0.2) times the requests waiting plus the one asking, rounded up, and at least a second."""
    now = [0.0]
    registry = CollectorRegistry()
    wait = Histogram("w", "", ["priority"], registry=registry)
    scheduler = FairScheduler(max_queued_per_session=1, wait_seconds=wait, clock=lambda: now[0])
    a1, a1_done = await _holding(scheduler, "a")
    now[0] = 1.0
    a2, a2_done = await _holding(scheduler, "a")
    refused = await _refused(scheduler, "a")  # no turn has ended: nothing to go by but the floor
    assert (refused.error, refused.retry_after) == ("too_many_queued", 1)
    assert refused.detail == (
        "this session already has 1 requests queued (--max-queued-per-session 1); retry after 1s"
    )
    now[0] = 4.0
    a1_done.set()  # a 4-second turn; a2, queued at 1 s, takes the next
    await a1
    assert registry.get_sample_value("w_sum", {"priority": "normal"}) == 3.0  # 0 s for a1, 3 s for a2
    b, b_done = await _holding(scheduler, "b")
    a3, a3_done = await _holding(scheduler, "a")
    assert scheduler.waiting == 2
    assert (await _refused(scheduler, "a")).retry_after == 12  # 4 s x (2 waiting + 1)
    now[0] = 13.0
    a2_done.set()  # a 9-second turn: the mean is 4 + 0.2 x (9 - 4) = 5 s; b's tag is before a3's
    await a2
    assert scheduler.waiting == 1
    assert (await _refused(scheduler, "a")).retry_after == 10  # 5 s x (1 waiting + 1)
    b_done.set()
    a3_done.set()
    await asyncio.gather(b, a3)


async def test_a_request_taking_its_turn_leaves_its_sessions_count_and_frees_a_place():
    scheduler = FairScheduler(max_queued_per_session=2)
    first, first_done = await _holding(scheduler, "a")
    rest = [await _holding(scheduler, "a") for _ in range(2)]
    assert scheduler.queued("a") == 2
    first_done.set()
    await first
    assert scheduler.queued("a") == 1 and scheduler.waiting == 1
    rest.append(await _holding(scheduler, "a"))  # the place the turn freed
    await _refused(scheduler, "a")
    for _, done in rest:
        done.set()
    await asyncio.gather(*(task for task, _ in rest))
    assert scheduler.queued("a") == 0 and scheduler.waiting == 0


async def test_equal_tags_are_served_in_arrival_order():
    """Sessions that each queue one request while another computes all start at the same virtual time."""
    scheduler = FairScheduler()
    served: list[str] = []
    holder, holder_done = await _holding(scheduler, "x")
    names = [f"s{i}" for i in range(8)]
    queued = [await _holding(scheduler, name, served) for name in names]
    holder_done.set()
    for task, done in queued:
        done.set()
        await task
    assert served == names
    await holder


async def test_a_session_is_forgotten_once_its_last_request_ends_at_or_before_virtual_time():
    """The virtual end of each session is kept only while it can still order a request: the scheduler's memory
    follows the sessions in contention, not every session it has served."""
    scheduler = FairScheduler()
    a1, a1_done = await _holding(scheduler, "a")  # tag 0, ends at 10
    b, b_done = await _holding(scheduler, "b")  # tag 0, ends at 10
    a2, a2_done = await _holding(scheduler, "a")  # tag 10, ends at 20
    a1_done.set()
    await a1
    b_done.set()
    await b  # a2 takes the turn: virtual time 10, when b's only request ended
    assert set(scheduler._finish) == {"a"}
    a2_done.set()
    await a2


async def test_sessions_served_one_after_another_leave_nothing_behind():
    """An idle model forgets every session: a thousand one-shot sessions in turn hold no memory, and a session
    that was served alone before the idle moment starts level with a new one."""
    scheduler = FairScheduler()
    for i in range(1000):
        async with scheduler.turn(f"once-{i}", 100):
            pass
    assert scheduler._finish == {}
    async with scheduler.turn("heavy", 10_000):
        pass
    assert await lanes(scheduler, {"heavy": (1, 10, "normal"), "new": (1, 10, "normal")}, 4) == [
        "heavy",
        "new",
        "heavy",
        "new",
    ]


async def test_turns_charged_by_time_cost_the_tokens_supervision_runs_in_as_long():
    """tokens_for() converts model time into tokens at the rate of turns charged by their tokens only."""
    now = [0.0]
    scheduler = FairScheduler(clock=lambda: now[0])
    assert scheduler.tokens_for(0.5, fallback=3) == 3  # no supervision turn seen yet
    async with scheduler.turn("trainer", 1000):
        now[0] += 0.1  # 1000 tokens in 0.1 s
    async with scheduler.turn("generation:a", 5, by_tokens=False):
        now[0] += 5.0  # a slow chunk does not change the rate
    assert scheduler.tokens_for(0.05, fallback=3) == 500
