"""Client scaling: N synthetic target servers with a fixed forward delay, throughput for N = 1, 2, 4.

Each server can do at most 1/forward_delay batches/s, so ideal throughput is N times the
single-server figure. The ratio tput(N) / (N * tput(1)), both measured in this run, shows
whether the client (dispatch, decoding, copying) is the bottleneck; the target is >= 0.9.

    python bench/client_scaling.py                       # servers in subprocesses (default)
    python bench/client_scaling.py --in-process          # servers on a thread of this process
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import torch
from aiohttp import web

from eagle3_target.client import PoolOptions, RemoteTargetBackend
from eagle3_target.client.bench import measure


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout: float = 120.0) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), opener.open(url + "/health", timeout=2) as response:
            if response.status == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not become healthy")


def synthetic_server(host: str, port: int, forward_delay: float) -> subprocess.Popen:
    """A quiet synthetic server in a process of its own. One torch thread per server: on a small shared
    machine, N servers' OpenMP pools spinning against each other turn a sub-millisecond projection into
    tens of milliseconds."""
    return subprocess.Popen(
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
        + ["--host", host, "--port", str(port), "--forward-delay", str(forward_delay)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


@contextlib.contextmanager
def subprocess_servers(count: int, forward_delay: float):
    hosts = [f"127.0.0.{i + 2}" for i in range(count)]
    ports = [free_port(h) for h in hosts]
    procs = [synthetic_server(h, p, forward_delay) for h, p in zip(hosts, ports, strict=False)]
    try:
        urls = [f"http://{h}:{p}" for h, p in zip(hosts, ports, strict=False)]
        for url in urls:
            wait_healthy(url)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


@contextlib.contextmanager
def in_process_servers(count: int, forward_delay: float):
    """All servers share one event loop on one thread of this process (each has its own model thread)."""
    from eagle3_target.server.app import TargetServer
    from eagle3_target.server.runners.synthetic import SyntheticRunner

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start(host: str):
        server = TargetServer(lambda: SyntheticRunner(dtype="float32", forward_delay=forward_delay))
        runner = web.AppRunner(server.app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, 0).start()
        return runner, f"http://{host}:{runner.addresses[0][1]}"

    started = [
        asyncio.run_coroutine_threadsafe(start(f"127.0.0.{i + 2}"), loop).result() for i in range(count)
    ]
    try:
        for _, url in started:
            wait_healthy(url)
        yield [url for _, url in started]
    finally:
        for runner, _ in started:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--counts", default="1,2,4", help="server counts (default 1,2,4)")
    p.add_argument("--forward-delay", type=float, default=0.05, help="seconds per forward (default 0.05)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--draft-vocab", type=int, default=64)
    p.add_argument("--batches-per-server", type=int, default=40, help="timed batches per server (default 40)")
    p.add_argument("--in-process", action="store_true", help="run the servers in this process")
    args = p.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    torch.set_num_threads(1)  # the client's tensor work is tiny; see subprocess_servers
    servers = in_process_servers if args.in_process else subprocess_servers

    print(
        f"# {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}, torch {torch.__version__}"
    )
    print(
        f"# servers {'in-process' if args.in_process else 'in subprocesses'}, forward delay "
        f"{args.forward_delay * 1000:.0f} ms, B={args.batch_size} S={args.seq_len} draft vocab {args.draft_vocab}"
    )
    results = {}
    with servers(max(counts), args.forward_delay) as urls:
        for n in counts:
            with RemoteTargetBackend(urls[:n], options=PoolOptions()) as backend:
                vocab = backend.model_info()["vocab_size"]
                mask = torch.zeros(vocab, dtype=torch.bool)
                mask[: args.draft_vocab] = True
                backend.set_vocab_mapping(torch.arange(args.draft_vocab), mask)
                assert backend.wait_for_servers() == n, "not every server joined"
                results[n] = tput = measure(
                    backend, args.batch_size, args.seq_len, args.batches_per_server * n, warmup=n, depth=n
                )
            ratio = tput.batches_per_s / (n * results[counts[0]].batches_per_s / counts[0])
            print(f"N={n}: {tput}  ratio {ratio:.3f}")
    ideal = 1 / args.forward_delay
    print(
        f"# single-server ceiling 1/forward_delay = {ideal:.1f} batches/s; "
        f"N=1 reached {results[counts[0]].batches_per_s / counts[0] / ideal:.1%} of it"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
