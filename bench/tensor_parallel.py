"""Tensor parallel: tokens/s of the hf engine split over T ranks against one rank, in the same run.

One randomly initialised Llama (saved once to a temporary directory) is served by `eagle3-target serve
--engine hf` with --tensor-parallel-size 1 and then T, one server at a time, and gets the same /generate
batches ("nemo" encoding, a 128-token draft vocabulary) over loopback HTTP. Reported per layout: tokens/s
(median over the batches, one warm-up first), the server's forward time (its Server-Timing header), the
per-request overhead (round trip minus forward, over forward); and the ratio tp-T / tp-1 of tokens/s.

On a CPU the threads are shared: --threads in all, so each of T ranks gets threads/T (a split that
cannot win on a machine whose cores one rank already fills; what it shows is the cost of the
collectives). On GPUs (--device cuda) each rank takes its own GPU:

    python bench/tensor_parallel.py                       # CPU: T=2 against T=1, 2 threads in all
    python bench/tensor_parallel.py --device cuda --dtype bfloat16 --tensor-parallel-size 2 --layers 32
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

from eagle3_target.client.connection import parse_server_timing
from eagle3_target.protocol import wire

ROOT = Path(__file__).resolve().parents[1]
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def write_model(path: Path, args: argparse.Namespace) -> None:
    from eagle3_target.server.runners.tiny import build_tiny_llama

    shape = dict(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(args.tensor_parallel_size, args.hidden // 256),
    )
    build_tiny_llama(seed=0, **shape).save_pretrained(path)


@contextlib.contextmanager
def server(model: Path, tp: int, args: argparse.Namespace):
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "eagle3_target.cli",
        "--log-level",
        "WARNING",
        "serve",
        "--model",
        str(model),
    ]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--tensor-parallel-size", str(tp)]
    cmd += ["--device", args.device, "--dtype", args.dtype, "--max-batch-tokens", str(args.batch * args.seq)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    if args.device == "cpu":
        env["OMP_NUM_THREADS"] = str(max(1, args.threads // tp))
    proc = subprocess.Popen(cmd, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while _status(url) != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the tp={tp} server did not come up")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(url: str) -> int:
    try:
        with OPENER.open(url + "/health", timeout=2) as resp:
            return resp.status
    except OSError:
        return 0


def post(url: str, endpoint: str, body: bytes) -> tuple[bytes, dict]:
    request = urllib.request.Request(f"{url}/{endpoint}", data=body, method="POST")
    with OPENER.open(request, timeout=600) as resp:
        return resp.read(), dict(resp.headers)


def measure(url: str, args: argparse.Namespace) -> dict:
    gen = torch.Generator().manual_seed(0)
    selected = torch.randperm(args.vocab, generator=gen)[:128]
    in_draft = torch.zeros(args.vocab, dtype=torch.bool)
    in_draft[selected] = True
    post(
        url,
        "set_vocab_mapping",
        wire.encode({"selected_token_ids": selected, "selected_token_mask": in_draft}),
    )
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
    body = wire.encode(
        {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
    )
    rounds, forwards = [], []
    for _ in range(args.repeats + 1):  # the first is a warm-up
        start = time.perf_counter()
        reply, headers = post(url, "generate", body)
        wire.decode(bytearray(reply))
        rounds.append(time.perf_counter() - start)
        forwards.append(parse_server_timing(headers["Server-Timing"]).get("forward", float("nan")))
    seconds, forward = statistics.median(rounds[1:]), statistics.median(forwards[1:])
    return dict(
        tokens_per_s=args.batch * args.seq / seconds,
        round_trip_s=seconds,
        forward_s=forward,
        overhead=(seconds - forward) / forward,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tensor-parallel-size", type=int, default=2, help="T, measured against 1 (default 2)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument(
        "--threads", type=int, default=2, help="CPU threads in all, split over the ranks (default 2)"
    )
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", type=Path, help="also write the numbers here")
    args = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        write_model(Path(tmp), args)
        for tp in (1, args.tensor_parallel_size):
            with server(Path(tmp), tp, args) as url:
                results[f"tp{tp}"] = measure(url, args)
    t = args.tensor_parallel_size
    report = dict(
        machine=f"{platform.machine()}, {os.cpu_count()} CPUs visible, torch {torch.__version__}",
        shape=f"{args.layers} layers, hidden {args.hidden}, vocab {args.vocab}, batch {args.batch}x{args.seq}",
        device=args.device,
        **results,
        ratio=results[f"tp{t}"]["tokens_per_s"] / results["tp1"]["tokens_per_s"],
    )
    for name, row in results.items():
        print(
            f"{name}: {row['tokens_per_s']:.0f} tokens/s, round trip {row['round_trip_s'] * 1000:.0f} ms, "
            f"forward {row['forward_s'] * 1000:.0f} ms, overhead {row['overhead']:.1%}"
        )
    print(f"tp{t} / tp1 tokens/s: {report['ratio']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
