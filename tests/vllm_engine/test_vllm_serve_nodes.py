"""Two `serve` processes as the two nodes of one vllm replica on loopback (tensor parallel 2, one rank
each): node-rank 0 replies within 1e-4 of the one-device hf engine (EAGLE-3's nemo encoding, a DFlash
feature request, /weights/lm_head); killing either node ends the other within 30 s (the head answers
503 first), and no worker process of either is left, nor of a node killed while its engine starts."""

import os
import subprocess
import sys
import time
import urllib.request

import aiohttp
import pytest
import torch
from parallel_support import TOLERANCE
from target_support import TargetProcess, free_port, generate_body, vocab_body

from eagle3_target.protocol import wire
from eagle3_target.protocol.contract import FEATURES_HEADER
from eagle3_target.protocol.families import dflash

from .split_support import AUX_LAYER_IDS, DFLASH_LAYERS, NODE_ENV, alive, batch, children, gaps

# Each node starts in about a minute on 2 idle cores, several on a loaded machine.
pytestmark = pytest.mark.timeout(1500)


def start_replica(model: str) -> tuple[TargetProcess, subprocess.Popen]:
    """Node-rank 1 first (it waits for its head), then node-rank 0; both with NODE_ENV."""
    os.environ.update({k: os.environ.get(k, v) for k, v in NODE_ENV.items()})
    flags = ["--engine", "vllm", "--model", model, "--dtype", "float32", "--tensor-parallel-size", "2"]
    flags += ["--aux-layer-ids", ",".join(map(str, AUX_LAYER_IDS)), "--nnodes", "2"]
    flags += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    command = [sys.executable, "-m", "eagle3_target.cli", "serve", "--host", "127.0.0.1"]
    follower = subprocess.Popen(
        [*command, "--port", str(free_port()), *flags, "--node-rank", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        head = TargetProcess("127.0.0.1", *flags, "--node-rank", "0")
        return head.wait_ready(timeout=1200), follower
    except BaseException:
        follower.kill()
        follower.wait()
        raise


async def served_replies(url: str, num_layers: int) -> dict[str, torch.Tensor]:
    """split_support.replies's tensors, asked of a server over HTTP."""
    input_ids, attention_mask, loss_mask, vocab = batch()
    out = {}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{url}/set_vocab_mapping", data=vocab_body(vocab.selected_token_ids, vocab.selected_token_mask)
        ) as resp:
            assert resp.status == 200, await resp.text()
        async with http.post(
            f"{url}/generate", data=generate_body(input_ids, attention_mask, loss_mask)
        ) as resp:
            assert resp.status == 200, await resp.text()
            out.update({f"nemo/{k}": v for k, v in wire.decode(bytearray(await resp.read())).items()})
        headers = {FEATURES_HEADER: dflash.FAMILY.ask(DFLASH_LAYERS, num_layers).to_header()}
        body = generate_body(input_ids, attention_mask)
        async with http.post(f"{url}/generate", data=body, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            out["dflash/hidden_states"] = wire.decode(bytearray(await resp.read()))["hidden_states"]
        async with http.post(f"{url}/weights/lm_head") as resp:
            out["weights/lm_head"] = wire.decode(bytearray(await resp.read()))["weight"]
    return out


def status(url: str, path: str) -> int:
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url + path, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def wait_gone(pids: list[int], deadline: float) -> list[int]:
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [pid for pid in pids if alive(pid)]


async def test_the_head_replies_within_1e_4_and_the_other_node_exits_when_it_is_killed(
    order_one_dir, one_device
):
    head, follower = start_replica(order_one_dir)
    try:
        got = gaps(await served_replies(head.url, 8), one_device)
        print("largest gaps, two serve nodes", got)
        assert max(got.values()) <= TOLERANCE, got
        workers = children(head.process.pid) + children(follower.pid)
        assert len(workers) >= 2
        head.kill()
        killed = time.monotonic()
        follower.wait(timeout=30)
        print(f"node-rank 1 exited {time.monotonic() - killed:.1f} s after node-rank 0 was killed")
        assert not wait_gone(workers, killed + 30), "orphan vLLM workers"
    finally:
        head.kill()
        follower.kill()
        follower.wait()


def test_killing_the_other_node_makes_the_head_answer_503_and_exit(order_one_dir):
    head, follower = start_replica(order_one_dir)
    try:
        workers = children(head.process.pid) + children(follower.pid)
        follower.kill()
        killed = time.monotonic()
        code = 200
        while code == 200 and time.monotonic() < killed + 30:
            time.sleep(0.2)
            code = status(head.url, "/health")
        print(f"node-rank 0 answered {code} {time.monotonic() - killed:.1f} s after node-rank 1 was killed")
        assert code == 503
        head.process.wait(timeout=max(1.0, killed + 30 - time.monotonic()))
        assert head.process.returncode != 0
        print(f"node-rank 0 exited {time.monotonic() - killed:.1f} s after node-rank 1 was killed")
        assert not wait_gone(workers, killed + 30), "orphan vLLM workers"
    finally:
        head.kill()
        follower.kill()
        follower.wait()
