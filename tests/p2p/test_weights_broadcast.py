"""A trainer's weights broadcast over gloo on loopback to two real servers of a tiny Llama (hf engine, float32):
refusals of every kind leave weights A serving bit for bit under their label, before any tensor moves or after
a sender breaks off midway, with the received tensors freed; then weights B broadcast to both replicas serve
bit for bit as a fresh load of B, under the new label."""

import asyncio
import gc
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import pytest_asyncio
import torch
from safetensors.torch import load_file
from target_support import generate_body, serve, vocab_body

from eagle3_target.client.broadcast import announcement, broadcast_refresh
from eagle3_target.protocol import contract
from eagle3_target.server.options import ServerOptions
from eagle3_target.server.p2p.options import P2POptions, PortRange
from eagle3_target.server.runners.hf import HFRunner
from eagle3_target.server.runners.tiny import build_tiny_llama

from .p2p_support import port_range

pytestmark = pytest.mark.asyncio(loop_scope="module")

ADMIN, TRAINER = "admin-secret", "trainer-secret"
TIMEOUT = 3.0  # the replicas' rendezvous and transfer deadlines
BATCH = generate_body(torch.arange(48).view(3, 16) % 500)
SENDER = Path(__file__).with_name("broadcast_sender.py")


def options() -> ServerOptions:
    start, end = port_range()
    p2p = P2POptions(
        port=start, port_range=PortRange(start, end), timeout=TIMEOUT, rendezvous_timeout=TIMEOUT
    )
    return ServerOptions(auth_token=TRAINER, admin_token=ADMIN, p2p=p2p)


def start(folder):
    return serve(lambda: HFRunner.load(str(folder)), options())


@pytest.fixture(scope="module")
def weights_b(tmp_path_factory):
    path = tmp_path_factory.mktemp("weights-b")
    build_tiny_llama(seed=2).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tensors_b(weights_b):
    return load_file(weights_b / "model.safetensors")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def replicas(tiny_model_dir):
    async with start(tiny_model_dir) as one, start(tiny_model_dir) as two:
        yield [one, two]


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


async def answer(server) -> tuple[str, bytes]:
    """(version header, reply body) of one /generate of BATCH, the session's draft vocabulary set first."""
    ids = torch.arange(0, 512, 5)
    mask = torch.zeros(512, dtype=torch.bool)
    mask[ids] = True
    await server.post("set_vocab_mapping", vocab_body(ids, mask), headers=bearer(TRAINER))
    async with server.http.post(f"{server.url}/generate", data=BATCH, headers=bearer(TRAINER)) as resp:
        assert resp.status == 200, await resp.text()
        return resp.headers[contract.TARGET_VERSION_HEADER], await resp.read()


async def model_version(server) -> str:
    async with server.http.post(f"{server.url}/model_info", headers=bearer(TRAINER)) as resp:
        return (await resp.json())["target_version"]


async def post(server, endpoint: str, body, token: str | None = ADMIN) -> tuple[int, dict]:
    headers = {} if token is None else bearer(token)
    async with server.http.post(f"{server.url}/{endpoint}", data=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def unchanged(replicas, before) -> None:
    """Each replica answers as before, bit for bit, under its old label, and holds no rendezvous port."""
    for server, (version, body) in zip(replicas, before, strict=True):
        assert await answer(server) == (version, body)
        assert await model_version(server) == version
        held = server.server.metrics.registry.get_sample_value("eagle3_target_p2p_ports_held")
        assert held == 0


def tensor_bytes() -> int:
    """Bytes of every tensor storage alive in this process (the replicas' included)."""
    gc.collect()
    storages = {}
    with warnings.catch_warnings():  # isinstance() on torch's deprecated module attributes warns
        warnings.simplefilter("ignore", FutureWarning)
        tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for tensor in tensors:
        if tensor.device.type == "cpu":
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


async def test_announcements_that_do_not_fit_are_refused_before_any_tensor_moves(replicas, tensors_b):
    before = [await answer(server) for server in replicas]
    urls = [server.url for server in replicas]
    norm = "model.norm.weight"
    cases = {
        "reshaped": {**tensors_b, norm: torch.ones(32)},
        "missing": {k: v for k, v in tensors_b.items() if k != norm},
        "extra": {**tensors_b, "model.extra.weight": torch.ones(3)},
        "other dtype": {**tensors_b, norm: tensors_b[norm].double()},
        "other architecture": build_tiny_llama(seed=2, hidden_size=32).state_dict(),
    }
    for case, tensors in cases.items():
        outcome = await asyncio.to_thread(broadcast_refresh, urls, tensors, "v2", ADMIN, timeout=30)
        assert not outcome.served and set(outcome.refused) == set(urls), case
        assert all(
            why.startswith(("400 source_mismatch", "400 source_incomplete"))
            for why in outcome.refused.values()
        ), (case, outcome)
        await unchanged(replicas, before)
    nan = {**tensors_b, "lm_head.weight": torch.full_like(tensors_b["lm_head.weight"], float("nan"))}
    outcome = await asyncio.to_thread(broadcast_refresh, urls, nan, "v2", ADMIN, timeout=30)
    assert set(outcome.refused) == set(urls), outcome
    assert all(why.startswith("400 source_corrupt") for why in outcome.refused.values()), (
        outcome
    )  # once received
    await unchanged(replicas, before)
    good = announcement(tensors_b, "v2")
    bodies = {
        "not json": (b"{", 400),
        "no version": (json.dumps({**json.loads(good), "version": "v 2"}), 400),
        "lists of two lengths": (json.dumps({**json.loads(good), "names": ["a"]}), 400),
        "unknown dtype": (json.dumps({**json.loads(good), "dtypes": ["float99"] * len(tensors_b)}), 400),
        "bad shape": (json.dumps({**json.loads(good), "shapes": [[-1]] * len(tensors_b)}), 400),
        "too large": (b" " * (17 << 20), 413),
    }
    for case, (body, status) in bodies.items():
        code, reply = await post(replicas[0], contract.BROADCAST, body)
        assert code == status and set(reply) == {"error", "detail"} and "\n" not in reply["detail"], (
            case,
            reply,
        )
    for token, status in ((None, 401), (TRAINER, 401), ("guess", 401)):
        code, reply = await post(replicas[0], contract.BROADCAST, good, token)
        assert (code, reply["error"]) == (status, "unauthorized"), reply
        code, reply = await post(
            replicas[0], contract.BROADCAST_OUTCOME, json.dumps({"transfer": "x"}), token
        )
        assert code == status, reply
    code, reply = await post(replicas[0], contract.BROADCAST_OUTCOME, json.dumps({"transfer": "nope"}))
    assert (code, reply["error"]) == (404, "unknown_transfer")
    await unchanged(replicas, before)


def sender(url: str, folder: Path) -> tuple[subprocess.Popen, str]:
    """A sender process that has sent half of ``folder``'s tensors to ``url``, and its transfer's id."""
    proc = subprocess.Popen(
        [sys.executable, str(SENDER), url, ADMIN, str(folder)], stdout=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline()
    assert line, f"the sender exited {proc.wait()}"
    return proc, json.loads(line)["transfer"]


@pytest.mark.parametrize("breaks_off", ["killed", "stalled"])
async def test_a_sender_that_breaks_off_midway_is_refused_and_leaves_the_old_weights(
    replicas, weights_b, tensors_b, breaks_off
):
    server = replicas[0]
    before = [await answer(s) for s in replicas]
    baseline = tensor_bytes()
    proc, transfer = await asyncio.to_thread(sender, server.url, weights_b)
    try:
        if breaks_off == "killed":
            proc.kill()
        async with asyncio.timeout(TIMEOUT + 10):  # the stalled one ends at the replica's --p2p-timeout
            code, reply = await post(server, contract.BROADCAST_OUTCOME, json.dumps({"transfer": transfer}))
    finally:
        proc.kill()
        proc.wait()
    assert (code, reply["error"]) == (400, "broadcast_incomplete"), reply
    await unchanged(replicas, before)
    weights = sum(t.numel() * t.element_size() for t in tensors_b.values())
    assert tensor_bytes() - baseline < weights / 4, "the tensors received before the break stay alive"


async def test_a_broadcast_serves_the_new_weights_on_every_replica_as_a_fresh_load(
    replicas, tensors_b, weights_b
):
    async with start(weights_b) as fresh:
        expected = (await answer(fresh))[1]
    urls = [server.url for server in replicas]
    outcome = await asyncio.to_thread(broadcast_refresh, urls, tensors_b, "policy-step-1", ADMIN, timeout=60)
    assert outcome.served == {url: "policy-step-1" for url in urls} and not outcome.refused, outcome
    for server in replicas:
        assert await answer(server) == ("policy-step-1", expected)
        assert await model_version(server) == "policy-step-1"
        served = server.server.metrics.registry.get_sample_value(
            "eagle3_target_weight_refreshes_total", {"outcome": "served"}
        )
        assert served == 1


async def test_a_server_without_p2p_refuses_a_broadcast_and_keeps_serving(tiny_model_dir, tensors_b):
    off = ServerOptions(auth_token=TRAINER, admin_token=ADMIN, p2p=P2POptions(enabled=False))
    async with serve(lambda: HFRunner.load(str(tiny_model_dir)), off) as server:
        before = await answer(server)
        outcome = await asyncio.to_thread(broadcast_refresh, [server.url], tensors_b, "v2", ADMIN, timeout=30)
        assert not outcome.served and outcome.refused[server.url].startswith("403 p2p_disabled"), outcome
        assert await answer(server) == before
        code, _ = await post(server, contract.REFRESH, json.dumps({"source": "/nowhere", "version": "v2"}))
        assert code == 400  # the refresh lock was given back: a later refresh is answered
