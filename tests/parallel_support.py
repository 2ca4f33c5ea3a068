"""What the tensor-parallel tests share: a tiny Llama on disk whose values are of order 1, so a 1e-4
tolerance against one device means something, and serve processes split over ranks."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import torch
from target_support import PORT_TAKEN, TargetProcess, free_port, generate_body, vocab_body
from transformers import LlamaConfig, LlamaForCausalLM

from eagle3_target.protocol import wire
from eagle3_target.protocol.contract import FEATURES_HEADER
from eagle3_target.protocol.families import families  # the feature descriptions: no NeMo (.ci/vllm has none)

TOLERANCE = 1e-4  # all-reduce reorders additions: close to one device, not bit-for-bit

# head_dim 32 (vLLM's CPU attention needs >= 32), 2 heads and 2 KV heads: tensor parallel 2 splits both
SPLIT_LLAMA = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=8,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)


def write_split_llama(path: Path, seed: int = 0, **overrides) -> Path:
    """A random float32 Llama with embeddings x50 and lm_head x10: aux states and logits of order 1."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**{**SPLIT_LLAMA, **overrides}))
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(50)
        model.get_output_embeddings().weight.mul_(10)
    model.save_pretrained(path)
    return path


def refused_line(*serve_args: str) -> str:
    """Run `serve` with ``serve_args``: it must exit 2 before loading, with exactly one error line."""
    for _ in range(5):  # again on another port if free_port()'s was taken before serve could bind it
        cmd = [sys.executable, "-m", "eagle3_target.cli", "serve", "--port", str(free_port()), *serve_args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        if PORT_TAKEN not in proc.stderr:
            break
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "listening on" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@contextlib.contextmanager
def two_serve_processes(flags: list[str]):
    """`serve` as node-rank 0 and node-rank 1 of one replica (not waited for); both killed on the way out."""
    started = []
    try:
        for rank in ("0", "1"):
            started.append(TargetProcess("127.0.0.1", *flags, "--node-rank", rank))
        yield started
    finally:
        for server in started:
            server.kill()


def children(pid: int) -> list[int]:
    """The processes ``pid`` started from any of its threads (its rank processes), from /proc."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        found += [int(p) for p in task.read_text().split()]
    return found


def alive(pid: int) -> bool:
    """Running: neither gone nor a zombie waiting for whoever inherited it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids: list[int], within: float) -> float:
    """Seconds until every one of ``pids`` has exited; fails past ``within``."""
    start = time.monotonic()
    while any(alive(p) for p in pids):
        assert time.monotonic() - start < within, (
            f"still running after {within}s: {[p for p in pids if alive(p)]}"
        )
        time.sleep(0.2)
    return time.monotonic() - start


V, L = SPLIT_LLAMA["vocab_size"], SPLIT_LLAMA["num_hidden_layers"]
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


def packed_body() -> bytes:
    """One row of three documents (NeMo's packing: positions per document, a 0-length entry as its collate pads)."""
    lengths = [11, 20, 9]
    ids = torch.randint(0, V, (1, sum(lengths)), generator=torch.Generator().manual_seed(4))
    ones = torch.ones_like(ids)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    packing = {"position_ids": positions, "seq_lens": torch.tensor([[*lengths, 0]])}
    return wire.encode({"input_ids": ids, "attention_mask": ones, "loss_mask": ones, **packing})


def replies(url: str) -> dict[str, torch.Tensor]:
    """Everything compared: the nemo encoding (also of a packed row), each text family's feature request,
    lm_head rows, the weights."""
    ids, mask, loss = batch()
    selected = torch.randperm(V, generator=torch.Generator().manual_seed(3))[:100]
    in_draft = torch.zeros(V, dtype=torch.bool)
    in_draft[selected] = True
    post(url, "set_vocab_mapping", vocab_body(selected, in_draft))
    got = {
        f"nemo.{k}": v
        for k, v in wire.decode(bytearray(post(url, "generate", generate_body(ids, mask, loss)))).items()
    }
    for name, found in families().items():  # every family a text target serves
        features = found.ask([-1, 2, 4, L - 1], L)
        if features.image_mask:
            continue
        header = features.to_header()
        body = post(url, "generate", generate_body(ids, mask, loss), **{FEATURES_HEADER: header})
        got.update({f"{name}.{k}": v for k, v in wire.decode(bytearray(body)).items()})
    got.update(
        {f"packed.{k}": v for k, v in wire.decode(bytearray(post(url, "generate", packed_body()))).items()}
    )
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
