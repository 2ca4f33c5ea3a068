"""A split replica lives and dies whole (server/ranks.py, server/rank_health.py): a dead rank makes rank 0
answer 503 on /health and /readyz and exit within 30 s; a dead rank 0 takes every other rank with it within
30 s; no rank process outlives its replica. Checked by SIGKILL and by pid."""

import contextlib
import os
import signal
import time
import urllib.error
import urllib.request

import pytest
from parallel_support import alive, children, two_serve_processes, wait_gone, write_split_llama
from target_support import TargetProcess, free_port

WITHIN = 30.0
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def status(url: str, path: str) -> int:
    try:
        with OPENER.open(url + path, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def split_server() -> tuple[TargetProcess, int]:
    """`serve --tensor-parallel-size 2` on the embedded tiny Llama, ready, and its one rank process."""
    server = TargetProcess("127.0.0.1", "--tensor-parallel-size", "2")
    try:
        server.wait_ready(300)
        (rank,) = children(server.process.pid)
    except BaseException:
        server.kill()
        raise
    return server, rank


def assert_503_then_exit(server: TargetProcess, start: float) -> None:
    seen = set()
    while server.process.poll() is None:
        with contextlib.suppress(OSError):  # the listener closes as the process exits
            seen.add((status(server.url, "/health"), status(server.url, "/readyz")))
        assert time.monotonic() - start < WITHIN, "rank 0 still running"
        time.sleep(0.2)
    assert (503, 503) in seen and server.process.returncode != 0


def test_a_dead_rank_makes_rank_0_answer_503_and_exit():
    server, rank = split_server()
    try:
        assert status(server.url, "/health") == 200
        start = time.monotonic()
        os.kill(rank, signal.SIGKILL)
        assert_503_then_exit(server, start)
    finally:
        server.kill()


def test_a_dead_rank_0_takes_its_ranks_with_it():
    server, rank = split_server()
    os.kill(server.process.pid, signal.SIGKILL)
    server.kill()
    wait_gone([rank], WITHIN)


@pytest.fixture
def two_nodes():
    flags = ["--tensor-parallel-size", "2", "--nnodes", "2", "--master-port", str(free_port())]
    with two_serve_processes(flags) as (leader, follower):
        leader.wait_ready(300)
        yield leader, follower


def test_across_nodes_a_dead_follower_node_stops_the_leader(two_nodes):
    leader, follower = two_nodes
    start = time.monotonic()
    os.kill(follower.process.pid, signal.SIGKILL)
    assert_503_then_exit(leader, start)


def test_across_nodes_a_dead_leader_node_stops_the_follower(two_nodes):
    leader, follower = two_nodes
    os.kill(leader.process.pid, signal.SIGKILL)
    follower.process.wait(WITHIN)
    assert follower.process.returncode != 0 and not alive(follower.process.pid)


def test_a_rank_a_follower_node_started_dying_stops_that_node_and_the_leader(tmp_path):
    """Two nodes of two ranks each (tensor parallel 4): node-rank 1's `serve` started rank 3 itself."""
    model = write_split_llama(
        tmp_path / "model", hidden_size=128, num_attention_heads=4, num_key_value_heads=4
    )
    flags = [
        "--model",
        str(model),
        "--tensor-parallel-size",
        "4",
        "--nnodes",
        "2",
        "--master-port",
        str(free_port()),
    ]
    with two_serve_processes(flags) as (leader, follower):
        leader.wait_ready(300)
        (rank_3,) = children(follower.process.pid)
        start = time.monotonic()
        os.kill(rank_3, signal.SIGKILL)
        # Its own watchdog, not rank 0's (which calls a silent rank dead only after 10 s): well within that.
        follower.process.wait(8)
        assert follower.process.returncode != 0
        assert_503_then_exit(leader, start)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_node_stopped_while_it_waits_for_its_head_exits_and_leaves_no_rank(tmp_path, signum):
    """Node-rank 1 of two ranks per node, its head never started: its `serve` and the rank it started wait.
    SIGTERM (a pod deleted) ends it at once with code 0; SIGKILL leaves its rank to see its parent gone."""
    model = write_split_llama(
        tmp_path / "model", hidden_size=128, num_attention_heads=4, num_key_value_heads=4
    )
    flags = ["--model", str(model), "--tensor-parallel-size", "4", "--nnodes", "2"]
    flags += ["--master-port", str(free_port()), "--node-rank", "1"]
    node = TargetProcess("127.0.0.1", *flags)
    try:
        deadline = time.monotonic() + 120
        while not (ranks := children(node.process.pid)):
            assert node.process.poll() is None and time.monotonic() < deadline, "no rank process started"
            time.sleep(0.2)
        time.sleep(1)  # the rank is waiting too
        os.kill(node.process.pid, signum)
        node.process.wait(5)
        took = wait_gone(ranks, WITHIN)
        print(f"{signal.Signals(signum).name}: the rank exited {took:.1f} s after its node's serve")
        if signum == signal.SIGTERM:
            assert node.process.returncode == 0
    finally:
        node.kill()
