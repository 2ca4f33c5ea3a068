"""A vLLM replica over two processes as two nodes on loopback (tensor parallel 2, one rank each): the head
replies within 1e-4 of the one-device hf engine, and when the head is killed the other node exits
within 30 s, leaving no worker process of either behind."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from parallel_support import TOLERANCE
from target_support import free_port

from .split_support import NODE_ENV, alive, children, gaps

pytestmark = pytest.mark.timeout(1200)

NODE = Path(__file__).with_name("vllm_node.py")
ENV = {**os.environ, **NODE_ENV, "PYTHONPATH": os.pathsep.join(sys.path)}


def start(tmp_path: Path, role: str, *args: str) -> subprocess.Popen:
    command = [sys.executable, str(NODE), role, *args]
    with open(tmp_path / f"{role}.log", "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(command, env=ENV, stdout=log, stderr=subprocess.STDOUT)


def wait_for(path: Path, procs: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert all(p.poll() is None for p in procs), "a node exited before the replica was up"
        assert time.monotonic() < deadline, "the replica did not come up"
        time.sleep(1)


@pytest.fixture(scope="module")
def two_nodes(order_one_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("two-nodes")
    port, out = str(free_port()), tmp / "head.pt"
    follower = start(tmp, "follow", order_one_dir, port)
    head = start(tmp, "head", order_one_dir, port, str(out))
    try:
        wait_for(out, [head, follower], timeout=1000)
        yield head, follower, torch.load(out)
    finally:
        for proc in (head, follower):
            proc.kill()
            proc.wait()


def test_the_head_replies_within_1e_4_of_one_device(two_nodes, one_device):
    _, _, saved = two_nodes
    got = gaps(saved["replies"], one_device)
    print("largest gaps, two nodes", got)
    assert max(got.values()) <= TOLERANCE, got


def test_killing_the_head_ends_the_other_node_within_30_s_and_leaves_no_worker(two_nodes):
    head, follower, saved = two_nodes
    workers = saved["workers"] + children(follower.pid)
    assert len(workers) >= 2 and all(alive(pid) for pid in workers)
    head.kill()
    killed = time.monotonic()
    follower.wait(timeout=30)
    took = time.monotonic() - killed
    print(f"the other node exited {took:.1f} s after the head was killed")
    deadline = killed + 30
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in workers if alive(pid)], "orphan vLLM workers"
