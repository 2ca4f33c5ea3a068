"""Padded against packed: useful (non-pad) tokens/s of the same conversations through one HF server on CPU.

Conversation lengths are log-normal (median --median, default 400 tokens; sigma --sigma) capped at --seq
(2048). Padded is NeMo's default (``padding="max_length"``): one conversation per row, padded to --seq.
Packed is NeMo's ``packed_sequence_size``: conversations back to back, greedily, in rows of --seq, the row's
padding folded into its last document; the server computes them under the block-causal mask. Both go through
our client (RemoteTargetBackend.generate_batch, EAGLE-3 supervision) in micro-batches of --batch rows, the
modes interleaved --repeats times; the result is the packed/padded ratio of useful tokens/s, both measured
in this run. The target is a small random Llama (no download), served by `eagle3-target serve --engine hf`.

    python bench/packing_throughput.py
    python bench/packing_throughput.py --smoke    # a seconds-long run at a small shape (the smoke test's)
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator

import torch

from eagle3_target.client import PoolOptions, RemoteTargetBackend
from eagle3_target.server.runners.tiny import build_tiny_llama

# vocab >> hidden as in real targets, small enough for a CPU forward of 2 x 2048 tokens in about a second
BENCH_LLAMA = dict(
    vocab_size=8192,
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
)
DRAFT_VOCAB = 2048

Batch = tuple[torch.Tensor, ...]


def conversation_lengths(count: int, median: float, sigma: float, cap: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    draws = torch.exp(math.log(median) + sigma * torch.randn(count, generator=gen))
    return [int(n) for n in draws.round().clamp(8, cap)]


def padded_batches(docs: list[torch.Tensor], seq: int, rows: int) -> list[Batch]:
    """One conversation per row, padded to seq."""
    batches = []
    for start in range(0, len(docs), rows):
        group = docs[start : start + rows]
        ids = torch.zeros(len(group), seq, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, doc in enumerate(group):
            ids[row, : len(doc)], mask[row, : len(doc)] = doc, 1
        batches.append((ids, mask, mask.clone()))
    return batches


def packed_rows(docs: list[torch.Tensor], seq: int) -> list[list[torch.Tensor]]:
    """Greedy, in order: a conversation that does not fit starts the next row."""
    rows: list[list[torch.Tensor]] = [[]]
    for doc in docs:
        if sum(map(len, rows[-1])) + len(doc) > seq:
            rows.append([])
        rows[-1].append(doc)
    return rows


def packed_batches(docs: list[torch.Tensor], seq: int, rows: int) -> list[Batch]:
    """NeMo's packed layout: position_ids per document (padding continues the last one's, below seq) and
    seq_lens [B, documents], 0-padded, each row summing to seq."""
    batches = []
    packs = packed_rows(docs, seq)
    for start in range(0, len(packs), rows):
        group = packs[start : start + rows]
        ids = torch.zeros(len(group), seq, dtype=torch.long)
        mask = torch.zeros_like(ids)
        positions = torch.zeros_like(ids)
        seq_lens = torch.zeros(len(group), max(map(len, group)), dtype=torch.long)
        for row, pack in enumerate(group):
            lengths = [len(doc) for doc in pack]
            used = sum(lengths)
            ids[row, :used], mask[row, :used] = torch.cat(pack), 1
            positions[row, :used] = torch.cat([torch.arange(n) for n in lengths])
            positions[row, used:] = (lengths[-1] + torch.arange(seq - used)).clamp(max=seq - 1)
            seq_lens[row, : len(pack)] = torch.tensor(lengths[:-1] + [lengths[-1] + seq - used])
        batches.append((ids, mask, mask.clone(), positions, seq_lens))
    return batches


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def hf_server(model_dir: str, threads: int) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "eagle3_target.cli", "--log-level", "WARNING", "serve", "--engine", "hf"]
    cmd += ["--model", model_dir, "--aux-layer-ids", "0,1,2", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server at {url} did not come up")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def run(backend: RemoteTargetBackend, batches: list[Batch]) -> float:
    """Seconds for the supervision of every batch, on the trainer's side (decoded, as a trainer gets it)."""
    start = time.perf_counter()
    for batch in batches:
        backend.generate_batch(*batch).target_probs.sum().item()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conversations", type=int, default=48)
    p.add_argument("--median", type=float, default=400.0, help="median conversation length in tokens")
    p.add_argument("--sigma", type=float, default=0.8, help="log-normal sigma of the lengths")
    p.add_argument("--seq", type=int, default=2048, help="row length: the padded length and the pack size")
    p.add_argument("--batch", type=int, default=2, help="rows per micro-batch")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="the server's OMP_NUM_THREADS")
    p.add_argument("--smoke", action="store_true", help="a small, fast shape: 12 conversations, rows of 256")
    args = p.parse_args()
    if args.smoke:
        args.conversations, args.median, args.seq, args.repeats = 12, 50.0, 256, 1
    lengths = conversation_lengths(args.conversations, args.median, args.sigma, args.seq, seed=0)
    gen = torch.Generator().manual_seed(1)
    docs = [torch.randint(0, BENCH_LLAMA["vocab_size"], (n,), generator=gen) for n in lengths]
    modes = {
        "padded": padded_batches(docs, args.seq, args.batch),
        "packed": packed_batches(docs, args.seq, args.batch),
    }
    useful = sum(lengths)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} client threads, server threads {args.threads}"
    )
    print(
        f"{len(docs)} conversations: median {statistics.median(lengths):.0f}, mean {useful / len(docs):.0f}, "
        f"max {max(lengths)} tokens; rows of {args.seq}, {args.batch} rows per micro-batch"
    )
    with tempfile.TemporaryDirectory() as model_dir:
        build_tiny_llama(seed=0, **BENCH_LLAMA).save_pretrained(model_dir)
        with hf_server(model_dir, args.threads) as url:
            options = PoolOptions(packing=True, request_timeout=600, deadline=1200)
            with RemoteTargetBackend(url, options=options) as backend:
                ids = torch.randperm(BENCH_LLAMA["vocab_size"], generator=gen)[:DRAFT_VOCAB]
                mask = torch.zeros(BENCH_LLAMA["vocab_size"], dtype=torch.bool)
                mask[ids] = True
                backend.set_vocab_mapping(ids, mask)
                run(backend, modes["packed"][:1])  # warm-up
                seconds = {mode: [] for mode in modes}
                for _ in range(args.repeats):
                    for mode, batches in modes.items():
                        seconds[mode].append(run(backend, batches))
    print(f"{'mode':8}{'rows':>6}{'tokens':>9}{'useful':>9}{'fill':>7}{'median s':>10}{'useful tok/s':>14}")
    rate = {}
    for mode, batches in modes.items():
        rows = sum(len(b[0]) for b in batches)
        median = statistics.median(seconds[mode])
        rate[mode] = useful / median
        print(
            f"{mode:8}{rows:>6}{rows * args.seq:>9}{useful:>9}{useful / (rows * args.seq):>7.0%}"
            f"{median:>10.2f}{rate[mode]:>14.0f}"
        )
    print(f"packed/padded useful tokens/s: {rate['packed'] / rate['padded']:.2f}x (goal: at least 1.5x)")


if __name__ == "__main__":
    main()
