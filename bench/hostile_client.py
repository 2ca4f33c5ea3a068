"""Hostile clients against real server processes: fuzz, hang-ups, stalled readers, idle sockets, one big body.

    python bench/hostile_client.py                 # 10,000 fuzz cases and every fault
    python bench/hostile_client.py --fuzz 20000 --seed 7

Each phase prints what the server answered, its RSS (MB) before, at peak and a few seconds after,
and the latency percentiles of /health probed on fresh connections every 100 ms throughout: the
kubelet's view of the pod while it is under attack. The fuzz runs against a small synthetic
server; the other phases against one whose /generate answers 302 MB (S=3072, aux 3 x 16384 bf16).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import resource
import socket
import struct
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hostile_support import Case, CaseGenerator, ServerProcess, raw_request  # noqa: E402
from target_support import generate_body, vocab_body  # noqa: E402

from eagle3_target.protocol import contract, wire  # noqa: E402

BIG = dict(hidden_size=16384, vocab_size=1024)
BIG_SEQ = 3072
SESSION = [(contract.SESSION_HEADER.encode(), b"bench")]


class Probe:
    """/health on a fresh connection every 100 ms, and the server's RSS, while a phase runs."""

    def __init__(self, srv: ServerProcess):
        self.srv = srv
        self.latencies: list[float] = []
        self.failures = 0
        self.peak = 0.0

    async def run(self) -> None:
        while True:
            start = time.monotonic()
            try:
                reply = await raw_request(
                    "127.0.0.1", self.srv.port, Case("GET", "/health", [], b""), timeout=10
                )
                ok = reply.status == 200
            except (OSError, TimeoutError, AssertionError):
                ok = False
            if ok:
                self.latencies.append(time.monotonic() - start)
            self.failures += not ok
            self.peak = max(self.peak, self.srv.rss_mb())
            await asyncio.sleep(0.1)


async def phase(name: str, srv: ServerProcess, work) -> None:
    before = srv.rss_mb()
    probe = Probe(srv)
    task = asyncio.create_task(probe.run())
    start = time.monotonic()
    detail = await work()
    elapsed = time.monotonic() - start
    await asyncio.sleep(3)
    task.cancel()
    after = srv.rss_mb()
    lat = sorted(probe.latencies) or [float("nan")]
    pct = {p: lat[min(len(lat) - 1, int(len(lat) * p / 100))] * 1000 for p in (50, 99)}
    print(
        f"{name:<16} {elapsed:6.1f}s  RSS {before:6.0f} -> peak {probe.peak:6.0f} -> {after:6.0f} MB  "
        f"/health p50 {pct[50]:6.1f} ms  p99 {pct[99]:7.1f} ms  max {lat[-1] * 1000:7.1f} ms  "
        f"failed {probe.failures}  | {detail}",
        flush=True,
    )


async def fuzz(srv: ServerProcess, n: int, seed: int) -> str:
    statuses = collections.Counter()
    cases = iter(CaseGenerator(seed, vocab=64).cases(n))

    async def worker() -> None:
        for case in cases:
            statuses[(await raw_request("127.0.0.1", srv.port, case)).status] += 1

    await asyncio.gather(*(worker() for _ in range(8)))
    return f"{n} cases: " + ", ".join(f"{code}: {count}" for code, count in sorted(statuses.items()))


async def set_mapping(srv: ServerProcess) -> None:
    vocab = BIG["vocab_size"]
    body = vocab_body(torch.arange(vocab), torch.ones(vocab, dtype=torch.bool))
    await raw_request("127.0.0.1", srv.port, Case("POST", "/set_vocab_mapping", SESSION, body))


def generate_request() -> bytes:
    body = generate_body(torch.zeros(1, BIG_SEQ, dtype=torch.long))
    head = f"POST /generate HTTP/1.1\r\nHost: t\r\n{contract.SESSION_HEADER}: bench\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def hang_ups(srv: ServerProcess) -> str:
    request = generate_request()

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(request)
        await reader.readexactly(1 << 20)
        writer.transport.abort()

    for _ in range(6):
        await asyncio.gather(*(one() for _ in range(8)))
    return "6 rounds of 8 clients hanging up on a 302 MB response"


async def stalled_readers(srv: ServerProcess) -> str:
    socks = []
    for _ in range(4):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", srv.port))
        sock.sendall(generate_request())
        socks.append(sock)
    start = time.monotonic()
    dropped = 0
    while dropped < 4 and time.monotonic() - start < 120:
        await asyncio.sleep(0.5)
        dropped = sum(_closed(sock) for sock in socks)
    for sock in socks:
        sock.close()
    return f"4 readers that never read: {dropped} dropped after {time.monotonic() - start:.0f}s"


def _closed(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        while data := sock.recv(1 << 20):
            del data
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True


async def idle_sockets(srv: ServerProcess) -> str:
    socks = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(1500)]
    await asyncio.sleep(5)
    for sock in socks:
        sock.close()
    return "1,500 idle sockets held open for 5 s"


async def big_body(srv: ServerProcess) -> str:
    entry = struct.pack("<I", 1) + b"k" + b"\x01"  # a None entry: 6 bytes
    body = wire.MAGIC_BYTES + entry * ((60 << 20) // len(entry))
    reply = await raw_request("127.0.0.1", srv.port, Case("POST", "/generate", SESSION, body))
    return f"one 60 MiB /generate body of 10M tiny entries: {reply.status}"


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fuzz", type=int, default=10_000, help="fuzz cases (default 10000)")
    p.add_argument("--seed", type=int, default=19)
    args = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))  # 1,500 sockets
    resource_note = "synthetic runner, one process per server, OMP_NUM_THREADS=1"
    print(f"hostile clients, {resource_note}", flush=True)
    with ServerProcess(dict(vocab_size=64), p2p={"timeout": 1.0}) as small:
        await phase("fuzz", small, lambda: fuzz(small, args.fuzz, args.seed))
    with ServerProcess(BIG, max_batch_tokens=1 << 20, write_timeout=5.0) as srv:
        await set_mapping(srv)
        await phase("hang-ups", srv, lambda: hang_ups(srv))
        await phase("stalled readers", srv, lambda: stalled_readers(srv))
        await phase("idle sockets", srv, lambda: idle_sockets(srv))
        await phase("big body", srv, lambda: big_body(srv))
        print(f"server logged {srv.logs().count('Traceback')} tracebacks", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
