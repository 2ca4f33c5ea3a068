"""The hf engine split over 2 ranks (tensor parallel, gloo on loopback) answers as one device does, within
1e-4 (all-reduce reorders additions): the nemo encoding, family feature requests, the lm_head rows and
/weights/*; the same across two `serve` processes started as two nodes."""

import json
import urllib.request

import pytest
import torch
from parallel_support import TOLERANCE, write_split_llama
from target_support import TargetProcess, free_port, generate_body, vocab_body

from eagle3_target.protocol import wire
from eagle3_target.protocol.contract import FEATURES_HEADER
from eagle3_target.protocol.families import family

V, L = 512, 8
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post(url: str, endpoint: str, body: bytes = b"", **headers) -> bytes:
    request = urllib.request.Request(f"{url}/{endpoint}", data=body, headers=headers, method="POST")
    with OPENER.open(request, timeout=120) as resp:
        return resp.read()


def batch():
    ids = torch.randint(0, V, (4, 40), generator=torch.Generator().manual_seed(1))
    mask = torch.zeros_like(ids)
    for row, length in enumerate([40, 17, 1, 33]):
        mask[row, :length] = 1
    loss = torch.randint(0, 2, ids.shape, generator=torch.Generator().manual_seed(2))
    return ids, mask, loss


def replies(url: str) -> dict[str, torch.Tensor]:
    """Everything compared: the nemo encoding, DFlash/JetSpec/DSpark features, lm_head rows, the weights."""
    ids, mask, loss = batch()
    selected = torch.randperm(V, generator=torch.Generator().manual_seed(3))[:100]
    in_draft = torch.zeros(V, dtype=torch.bool)
    in_draft[selected] = True
    post(url, "set_vocab_mapping", vocab_body(selected, in_draft))
    got = {
        f"nemo.{k}": v
        for k, v in wire.decode(bytearray(post(url, "generate", generate_body(ids, mask, loss)))).items()
    }
    for name, layers in (
        ("dflash", [1, 3, 5, L - 1]),
        ("jetspec", [1, 3, 5, L - 1]),
        ("dspark", [-1, 2, 4, L - 1]),
    ):
        header = family(name).ask(layers, L).to_header()
        body = post(url, "generate", generate_body(ids, mask, loss), **{FEATURES_HEADER: header})
        got.update({f"{name}.{k}": v for k, v in wire.decode(bytearray(body)).items()})
    got["lm_head_rows"] = wire.decode(bytearray(post(url, "lm_head")))["weight"]
    for name in ("lm_head", "input_embeddings", "final_norm"):
        got[f"weights/{name}"] = wire.decode(bytearray(post(url, f"weights/{name}")))["weight"]
    return got


def assert_close(split: dict, one: dict) -> None:
    assert list(split) == list(one)
    for key, want in one.items():
        got = split[key]
        assert got.dtype == want.dtype and got.shape == want.shape, key
        if want.is_floating_point():
            gap = (got - want).abs().max().item()
            assert gap <= TOLERANCE, f"{key}: {gap:.2e}"
        else:
            assert torch.equal(got, want), key


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(write_split_llama(tmp_path_factory.mktemp("split-llama")))


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
    leader = TargetProcess("127.0.0.1", *flags)
    follower = TargetProcess("127.0.0.1", *flags, "--node-rank", "1")
    try:
        leader.wait_ready(300)
        assert layout(leader.url) == {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "nnodes": 2}
        assert_close(replies(leader.url), one_device)
        with OPENER.open(f"{follower.url}/livez", timeout=5) as resp:
            assert json.loads(resp.read())["role"] == "follower"
        with pytest.raises(urllib.error.HTTPError) as error:  # no model endpoints on node-rank 1
            post(follower.url, "model_info")
        assert error.value.code == 404
    finally:
        leader.kill()
        follower.kill()


def test_one_device_reports_no_layout(model):
    server = TargetProcess("127.0.0.1", "--model", model).wait_ready(300)
    try:
        assert layout(server.url) is None
    finally:
        server.kill()
