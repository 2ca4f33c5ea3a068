"""Fixtures: the tiny target and its chats, and real target servers on loopback."""

from __future__ import annotations

import pytest
from nemo.nemo_support import build_target, write_chats
from target_support import TargetProcess

from .precompute_support import synthetic_target

SAMPLES = 12


@pytest.fixture(scope="session")
def target(tmp_path_factory):
    root = tmp_path_factory.mktemp("precompute-target")
    return build_target(root / "model"), write_chats(root / "chats.jsonl", SAMPLES)


@pytest.fixture(scope="session")
def hf_server(target):
    """`eagle3-target serve --engine hf` on the tiny target (float32 on CPU)."""
    server = TargetProcess("127.0.0.7", "--engine", "hf", "--model", str(target[0]))
    try:
        yield server.wait_ready()
    finally:
        server.kill()


@pytest.fixture(scope="session")
def slow_fleet(target, tmp_path_factory):
    """A synthetic server taking 0.25 s per forward (slow enough to kill a run mid-way), and a target
    directory with its shape and the tiny target's tokenizer."""
    model = synthetic_target(tmp_path_factory.mktemp("synthetic") / "model", target[0])
    server = TargetProcess("127.0.0.8", "--engine", "synthetic", "--forward-delay", "0.25")
    try:
        yield server.wait_ready(), model
    finally:
        server.kill()
