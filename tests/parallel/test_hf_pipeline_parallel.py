"""The hf engine split into 2 pipeline stages (gloo on loopback) answers bit for bit as one device does:
each stage runs the same operations in the same order as the one-device forward (no all-reduce), and every
capture is sent whole to rank 0 — the nemo encoding (also of a packed row), family feature requests, the
lm_head rows and /weights/*; the same across two `serve` processes started as two nodes."""

import json

import pytest
import torch
from parallel_support import post, replies, two_serve_processes, write_split_llama
from target_support import TargetProcess, free_port


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(write_split_llama(tmp_path_factory.mktemp("split-llama")))


@pytest.fixture(scope="module")
def one_device(model):
    server = TargetProcess("127.0.0.1", "--model", model).wait_ready(300)
    yield replies(server.url)
    server.kill()


def assert_equal(split: dict, one: dict) -> None:
    assert list(split) == list(one)
    for key, want in one.items():
        got = split[key]
        assert got.dtype == want.dtype and got.shape == want.shape, key
        assert torch.equal(got, want), f"{key}: {(got.double() - want.double()).abs().max().item():.2e}"


def test_pipeline_parallel_2_answers_bit_for_bit_as_one_device(model, one_device):
    server = TargetProcess("127.0.0.1", "--model", model, "--pipeline-parallel-size", "2").wait_ready(300)
    try:
        parallel = json.loads(post(server.url, "model_info"))["parallel"]
        assert parallel == {"tensor_parallel_size": 1, "pipeline_parallel_size": 2, "nnodes": 1}
        assert_equal(replies(server.url), one_device)
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
        assert_equal(replies(leader.url), one_device)
