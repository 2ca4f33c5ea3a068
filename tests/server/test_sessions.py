"""The session table on a clock the test turns (server/sessions.py): expiry at its edge, the bound on sessions,
the mappings kept for stock NeMo clients, the gauge and the end callbacks."""

import pytest
import torch
from prometheus_client import CollectorRegistry, Gauge

from eagle3_target.protocol.supervision import VocabMapping
from eagle3_target.server.errors import TooManySessions
from eagle3_target.server.sessions import MAX_KEPT_MAPPINGS, PEER_PREFIX, SessionTable, session_id


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def table(ttl: float = 10.0, max_sessions: int = 4):
    clock, registry = Clock(), CollectorRegistry()
    gauge = Gauge("sessions", "live sessions", registry=registry)
    sessions = SessionTable(ttl, clock=clock, max_sessions=max_sessions, gauge=gauge)
    ended = []
    sessions.on_end(lambda s: ended.append(s.id))
    return sessions, clock, lambda: registry.get_sample_value("sessions"), ended


def mapping(n: int) -> VocabMapping:
    return VocabMapping(torch.arange(n), torch.ones(n, dtype=torch.bool))


def test_a_session_is_named_by_its_header_else_by_its_peer():
    assert session_id("trainer-1", "10.0.0.5:4242") == "trainer-1"
    assert (
        session_id(None, "10.0.0.5:4242") == session_id("", "10.0.0.5:4242") == f"{PEER_PREFIX}10.0.0.5:4242"
    )


def test_a_session_idle_for_exactly_the_ttl_lives_a_moment_longer():
    sessions, clock, gauge, ended = table(ttl=10.0)
    sessions.touch("a")
    clock.now += 5
    sessions.touch("b")
    assert gauge() == 2
    clock.now += 5  # a: idle exactly 10 s
    assert sessions.expire() == [] and "a" in sessions
    clock.now += 0.001
    assert sessions.expire() == ["a"] and "a" not in sessions and "b" in sessions
    assert ended == ["a"] and gauge() == 1
    clock.now += 5
    sessions.touch("b")  # a request or heartbeat moves it on
    clock.now += 10
    assert sessions.expire() == [] and len(sessions) == 1


def test_a_ttl_under_a_second_still_expires():
    sessions, clock, _, _ = table(ttl=0.5)
    sessions.touch("a")
    clock.now += 0.6
    assert sessions.expire() == ["a"]


@pytest.mark.parametrize("ttl", [0.0, -1.0])
def test_no_ttl_keeps_sessions_for_ever(ttl):
    sessions, clock, _, ended = table(ttl=ttl)
    sessions.touch("a")
    clock.now += 1e9
    assert sessions.expire() == [] and "a" in sessions and ended == []


def test_the_number_of_sessions_is_bounded_but_the_ones_there_go_on():
    sessions, _, gauge, _ = table(max_sessions=2)
    first, _second = sessions.touch("a"), sessions.touch("b")
    with pytest.raises(TooManySessions) as error:
        sessions.touch("c")
    assert (error.value.error, error.value.detail) == (
        "too_many_requests",
        "this server already holds 2 sessions",
    )
    assert sessions.touch("a") is first and len(sessions) == 2 and gauge() == 2
    assert sessions.end("b") and sessions.touch("c").id == "c"


def test_ending_a_session_tells_who_listens_once():
    sessions, _, gauge, ended = table()
    sessions.touch("a")
    assert sessions.end("a") is True
    assert sessions.end("a") is False and sessions.end("never") is False
    assert ended == ["a"] and gauge() == 0
    sessions.touch("b"), sessions.touch("c")
    sessions.end_all()
    assert sorted(ended) == ["a", "b", "c"] and len(sessions) == 0 and gauge() == 0


def test_a_peer_named_session_keeps_its_mapping_for_its_next_request_and_no_other_does():
    sessions, _, _, _ = table()
    peer, named = session_id(None, "10.0.0.5:1"), session_id("ours", None)
    sessions.touch(peer).vocab = mapping(3)
    sessions.touch(named).vocab = mapping(4)
    sessions.end(peer), sessions.end(named)
    assert sessions.touch(peer).vocab.selected_token_ids.tolist() == [0, 1, 2]
    assert sessions.touch(named).vocab is None
    sessions.end(peer)
    sessions.touch(peer)  # the kept mapping went back into the session: kept once, not twice
    sessions.touch(peer).vocab = None
    sessions.end(peer)
    assert sessions.touch(peer).vocab is None


def test_kept_mappings_are_bounded_and_the_oldest_goes_first():
    sessions, _, _, _ = table(max_sessions=MAX_KEPT_MAPPINGS + 8)
    peers = [session_id(None, f"10.0.{i // 250}.{i % 250}:1") for i in range(MAX_KEPT_MAPPINGS + 1)]
    for i, peer in enumerate(peers):
        sessions.touch(peer).vocab = mapping(i + 1)
        sessions.end(peer)
    assert sessions.touch(peers[0]).vocab is None  # the oldest was dropped
    assert sessions.touch(peers[1]).vocab.selected_token_ids.numel() == 2
    assert sessions.touch(peers[-1]).vocab.selected_token_ids.numel() == MAX_KEPT_MAPPINGS + 1
