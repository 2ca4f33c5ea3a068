"""What the tensor-parallel tests share: a tiny Llama on disk whose values are of order 1, so a 1e-4
tolerance against one device means something, and serve processes split over ranks."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import torch
from target_support import PORT_TAKEN, free_port
from transformers import LlamaConfig, LlamaForCausalLM

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


def write_split_llama(path: Path, seed: int = 0) -> Path:
    """A random float32 Llama with embeddings x50 and lm_head x10: aux states and logits of order 1."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**SPLIT_LLAMA))
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
