"""The hf engine split into 2 pipeline stages (gloo on loopback) answers bit for bit as one device does:
each stage runs the same operations in the same order as the one-device forward (no all-reduce), and every
capture is sent whole to rank 0 — the nemo encoding (also of a packed row), family feature requests, the
lm_head rows and /weights/*; the same across two `serve` processes started as two nodes."""

import contextlib
import json
import os
import signal
import time
import urllib.error

import pytest
import torch
from parallel_support import OPENER, L, batch, children, post, replies, two_serve_processes
from target_support import TargetProcess, free_port, generate_body

from eagle3_target.protocol import wire
from eagle3_target.protocol.contract import FEATURES_HEADER
from eagle3_target.protocol.families import family
from eagle3_target.server.runners.hf_pipeline import stage_layers


def answers(url: str) -> dict[str, torch.Tensor]:
    """replies(), and layers that stop the pipeline early: in the first stage only (the second runs
    nothing), the embedding output alone, and an unsorted pair that ends inside the second stage."""
    got = replies(url)
    ids, mask, loss = batch()
    for layers in ([2, 0], [-1], [5, 1]):
        header = family("dflash").ask(layers, L).to_header()
        body = post(url, "generate", generate_body(ids, mask, loss), **{FEATURES_HEADER: header})
        got.update({f"dflash{layers}.{k}": v for k, v in wire.decode(bytearray(body)).items()})
    return got


@pytest.fixture(scope="module")
def one_device(model):
    server = TargetProcess("127.0.0.1", "--model", model).wait_ready(300)
    yield answers(server.url)
    server.kill()


def assert_equal(split: dict, one: dict) -> None:
    assert list(split) == list(one)
    for key, want in one.items():
        got = split[key]
        assert got.dtype == want.dtype and got.shape == want.shape, key
        assert torch.equal(got, want), f"{key}: {(got.double() - want.double()).abs().max().item():.2e}"


@pytest.mark.parametrize("layers, stages", [(8, 2), (7, 2), (80, 3), (5, 5)])
def test_stages_hold_contiguous_slices_the_later_ones_one_more(layers, stages):
    slices = [stage_layers(s, stages, layers) for s in range(stages)]
    assert [i for part in slices for i in part] == list(range(layers))
    sizes = [len(part) for part in slices]
    assert sizes == sorted(sizes) and sizes[-1] - sizes[0] <= 1


def health(url: str) -> int:
    try:
        with OPENER.open(f"{url}/health", timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_pipeline_parallel_2_answers_bit_for_bit_as_one_device_and_dies_whole(model, one_device):
    """Then a dead stage: rank_health.py's rule holds for stages as for shards (test_rank_death.py)."""
    server = TargetProcess("127.0.0.1", "--model", model, "--pipeline-parallel-size", "2").wait_ready(300)
    try:
        parallel = json.loads(post(server.url, "model_info"))["parallel"]
        assert parallel == {"tensor_parallel_size": 1, "pipeline_parallel_size": 2, "nnodes": 1}
        assert_equal(answers(server.url), one_device)
        (rank,) = children(server.process.pid)
        start, seen = time.monotonic(), set()
        os.kill(rank, signal.SIGKILL)
        while server.process.poll() is None:
            with contextlib.suppress(OSError):  # the listener closes as the process exits
                seen.add(health(server.url))
            assert time.monotonic() - start < 30, "rank 0 still running"
            time.sleep(0.2)
        assert 503 in seen and server.process.returncode != 0
    finally:
        server.kill()


def test_two_serve_processes_as_two_pipeline_stages_answer_as_one_device(model, one_device):
    flags = [
        "--model",
        model,
        "--pipeline-parallel-size",
        "2",
        "--nnodes",
        "2",
        "--master-port",
        str(free_port()),
    ]
    with two_serve_processes(flags) as (leader, _follower):
        leader.wait_ready(300)
        assert_equal(answers(leader.url), one_device)
