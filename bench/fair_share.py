"""Fair share: trainer processes with different max_in_flight sharing one synthetic target server.

    python bench/fair_share.py                                   # in flight 1, 1 and 8; 20 s; 50 ms forward
    python bench/fair_share.py --in-flight 1,1,8 --seconds 20 --forward-delay 0.05

One `eagle3-target serve --engine synthetic` in a subprocess. Each trainer is a process of its own,
as on a shared fleet: a RemoteTargetBackend with max_in_flight k that keeps k batches in flight
(prefetch). First the greediest trainer runs alone for the window (the baseline); then all of them
start together, once each has joined, and each counts the batches it receives in the same window.
Printed per trainer: batches/s and its share over the mean (goal: each within [0.75, 1.33]); and
the trainers' total over the greedy one alone (goal: at least 0.85, no throughput lost to fairness).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from client_scaling import free_port, wait_healthy  # noqa: E402  (the sibling bench's helpers)


def trainer(url: str, in_flight: int, seconds: float, batch: int, seq: int, draft: int) -> None:
    """One trainer process: join, say "ready", wait for "go" on stdin, then count batches for ``seconds``."""
    import torch

    from eagle3_target.client import PoolOptions, RemoteTargetBackend

    torch.set_num_threads(1)
    with RemoteTargetBackend([url], options=PoolOptions(max_in_flight=in_flight)) as backend:
        vocab = backend.model_info()["vocab_size"]
        mask = torch.zeros(vocab, dtype=torch.bool)
        mask[:draft] = True
        backend.set_vocab_mapping(torch.arange(draft), mask)
        ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
        ones = torch.ones_like(ids)
        print("ready", flush=True)
        sys.stdin.readline()
        start = time.perf_counter()
        deadline = start + seconds
        count = 0
        for _ in backend.prefetch(iter(lambda: (ids, ones, ones), None), depth=in_flight):
            count += 1
            if time.perf_counter() >= deadline:
                break
        elapsed = time.perf_counter() - start
    print(json.dumps({"in_flight": in_flight, "batches": count, "seconds": elapsed}), flush=True)


def run_trainers(url: str, in_flight: list[int], args: argparse.Namespace) -> list[dict]:
    """Start one process per trainer, release them together once all have joined, collect their counts."""
    common = [str(args.seconds), str(args.batch_size), str(args.seq_len), str(args.draft_vocab)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--trainer", url, str(k), *common],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for k in in_flight
    ]
    try:
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a trainer failed to join the server")
        for proc in procs:  # all released within a millisecond or so
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = [json.loads(proc.stdout.readline()) for proc in procs]
        for proc in procs:
            proc.wait(60)
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--in-flight", default="1,1,8", help="each trainer's max_in_flight (default 1,1,8)")
    p.add_argument("--seconds", type=float, default=20.0, help="the measured window (default 20)")
    p.add_argument("--forward-delay", type=float, default=0.05, help="seconds per forward (default 0.05)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--draft-vocab", type=int, default=64)
    p.add_argument("--trainer", nargs=6, help=argparse.SUPPRESS)  # a trainer process (run_trainers)
    args = p.parse_args()
    if args.trainer:
        url, k, seconds, batch, seq, draft = args.trainer
        trainer(url, int(k), float(seconds), int(batch), int(seq), int(draft))
        return 0
    in_flight = [int(k) for k in args.in_flight.split(",")]
    host, port = "127.0.0.1", free_port("127.0.0.1")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eagle3_target.cli",
            "--log-level",
            "WARNING",
            "serve",
            "--engine",
            "synthetic",
        ]
        + ["--host", host, "--port", str(port), "--forward-delay", str(args.forward_delay)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    url = f"http://{host}:{port}"
    try:
        wait_healthy(url)
        print(
            f"# {platform.node()}, {os.cpu_count()} CPUs, python {platform.python_version()}; one synthetic "
            f"server, forward {args.forward_delay * 1000:.0f} ms, B={args.batch_size} S={args.seq_len}, "
            f"{args.seconds:.0f} s windows"
        )
        [alone] = run_trainers(url, [max(in_flight)], args)
        alone_rate = alone["batches"] / alone["seconds"]
        print(f"alone: max_in_flight {alone['in_flight']}: {alone_rate:.2f} batches/s")
        shared = run_trainers(url, in_flight, args)
    finally:
        server.terminate()
        server.wait(10)
    rates = [r["batches"] / r["seconds"] for r in shared]
    mean = sum(rates) / len(rates)
    for r, rate in zip(shared, rates, strict=True):
        print(f"shared: max_in_flight {r['in_flight']}: {rate:.2f} batches/s, {rate / mean:.2f}x the mean")
    shares = [rate / mean for rate in rates]
    print(
        f"# shares {min(shares):.2f}..{max(shares):.2f} of the mean (goal within 0.75..1.33); total "
        f"{sum(rates):.2f} batches/s = {sum(rates) / alone_rate:.2f}x the greedy trainer alone (goal >= 0.85)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
