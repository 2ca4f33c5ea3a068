"""The beats of a vLLM replica's nodes (server/runners/vllm_ranks.py's Heartbeat), without vLLM: a real
TCPStore on loopback stands for the replica's rendezvous store, and the node beats are written to it by
hand. A node that has beaten and stops is gone after ``STALE_S``, even when it stops as soon as the head
starts watching (the head is ready, and a node killed, moments after its engine is up); a node that has
not beaten yet has ``START_S``. The constants are shrunk so that each case takes a second or two."""

import time
from datetime import timedelta

import pytest
from target_support import free_port
from torch.distributed import TCPStore

from eagle3_target.server.parallel import ParallelLayout
from eagle3_target.server.runners import vllm_ranks
from eagle3_target.server.runners.vllm_ranks import BEAT_KEY, Heartbeat

BEAT_S, STALE_S, START_S = 0.1, 1.0, 60.0


@pytest.fixture
def store(monkeypatch):
    """The replica's store (as global rank 0 serves it) and the head's layout, two nodes."""
    monkeypatch.setattr(vllm_ranks, "BEAT_S", BEAT_S)
    monkeypatch.setattr(vllm_ranks, "STALE_S", STALE_S)
    monkeypatch.setattr(vllm_ranks, "START_S", START_S)
    port = free_port()
    server = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False)
    yield server, ParallelLayout(tensor_parallel_size=2, nnodes=2, master_port=port)


def gone_after(beat: Heartbeat, within: float) -> float | None:
    """Seconds until ``beat`` calls a watched node gone, or None if it did not within ``within``."""
    start = time.monotonic()
    while beat.alive() and time.monotonic() - start < within:
        time.sleep(0.05)
    return None if beat.alive() else time.monotonic() - start


def test_a_node_that_beat_and_stops_as_the_head_starts_watching_is_gone_after_stale_s(store):
    server, layout = store
    for _ in range(5):  # node 1 beat while the head's engine started, then was killed
        server.add(BEAT_KEY.format(1), 1)
    head = Heartbeat(layout, watched=[1])
    try:
        within = STALE_S + 10 * BEAT_S
        took = gone_after(head, within)
        assert took is not None, f"node 1 still counted alive {within:.1f} s after its last beat"
        assert took >= STALE_S
        assert "node 1 stopped beating" in head.gone
    finally:
        head.stop()


def test_a_node_that_keeps_beating_or_has_not_beaten_yet_is_not_gone(store):
    server, layout = store
    head = Heartbeat(layout, watched=[1])  # node 1 has not beaten yet: START_S, not STALE_S
    try:
        deadline = time.monotonic() + 2 * STALE_S
        assert gone_after(head, deadline - time.monotonic()) is None
        while time.monotonic() < deadline + 2 * STALE_S:  # and now beats every BEAT_S
            server.add(BEAT_KEY.format(1), 1)
            time.sleep(BEAT_S)
            assert head.alive(), head.gone
        assert server.add(BEAT_KEY.format(0), 0) > 0  # the head beats too
    finally:
        head.stop()
