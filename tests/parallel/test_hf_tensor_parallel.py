"""The hf engine split over 2 ranks (tensor parallel, gloo on loopback) answers as one device does, within
1e-4 (all-reduce reorders additions): the nemo encoding, family feature requests, the lm_head rows and
/weights/*; the same across two `serve` processes started as two nodes."""

import json
import urllib.error

import pytest
from parallel_support import OPENER, assert_close, post, replies, two_serve_processes
from target_support import TargetProcess, free_port


@pytest.fixture(scope="module")
def one_device(model):
    server = TargetProcess("127.0.0.1", "--model", model).wait_ready(300)
    yield replies(server.url)
    server.kill()


def layout(url: str) -> dict | None:
    return json.loads(post(url, "model_info")).get("parallel")


def test_tensor_parallel_2_answers_as_one_device(model, one_device):
    server = TargetProcess("127.0.0.1", "--model", model, "--tensor-parallel-size", "2").wait_ready(300)
    try:
        assert layout(server.url) == {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "nnodes": 1}
        assert_close(replies(server.url), one_device)
    finally:
        server.kill()


def test_two_serve_processes_as_two_nodes_answer_as_one_device(model, one_device):
    flags = [
        "--model",
        model,
        "--tensor-parallel-size",
        "2",
        "--nnodes",
        "2",
        "--master-port",
        str(free_port()),
    ]
    with two_serve_processes(flags) as (leader, follower):
        leader.wait_ready(300)
        assert layout(leader.url) == {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "nnodes": 2}
        assert_close(replies(leader.url), one_device)
        with OPENER.open(f"{follower.url}/livez", timeout=5) as resp:
            assert json.loads(resp.read())["role"] == "follower"
        with pytest.raises(urllib.error.HTTPError) as error:  # no model endpoints on node-rank 1
            post(follower.url, "model_info")
        assert error.value.code == 404


def test_one_device_reports_no_layout(model):
    server = TargetProcess("127.0.0.1", "--model", model).wait_ready(300)
    try:
        assert layout(server.url) is None
    finally:
        server.kill()
