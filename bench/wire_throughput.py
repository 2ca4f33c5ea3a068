"""Loopback /generate throughput on the wire path, against raw TCP moving the same bytes in the same run.

    python bench/wire_throughput.py [--repeats N] [--shapes 8b small] [--encoding nemo logits hidden]

The server runs in its own process with the synthetic runner (no model). A response's
transfer time is the client's round trip minus the server's compute phases, which the
server reports in its Server-Timing header (decode, forward, projection, encode): what is
left is sending, receiving and decoding the body into tensors, the part the wire format
and HTTP stack are responsible for. The baseline is one socket.sendall of a
preallocated buffer into recv_into on the other side, between two processes, one transfer in each
round of HTTP requests so that both see the same load (also shown, measured after: the same into
a fresh buffer per transfer, as a receiver that keeps the data must do). Where
nemo-automodel is installed, NeMo's own client (requests, reading the body in 10 KiB pieces and
decoding with copies) is timed against the same server for comparison.

Server loop CPU: user and system time of the server process's main thread, where its event loop
parses requests and sends replies (the runner computes on other threads), per 100 MB sent in the
HTTP rounds.

Peak client RSS: a fresh client process warms up on a 16-token reply, then receives one full
reply and holds its tensors; its VmHWM (reset after the warm-up) minus its RSS before the reply,
for our client (``read_tensors``) and, where installed, NeMo's.

With --encoding, each supervision encoding named is fetched from the same server in turn; a
second table gives bytes per token and tokens/s per encoding, next to raw TCP moving the "nemo"
reply's bytes. Tokens/s counts the transfer only: turning "logits" or "hidden" into target_probs
runs on the trainer's device afterwards (protocol/encodings.py decode).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import socket
import statistics
import time
from collections.abc import Callable, Iterator

import aiohttp
import torch

from eagle3_target.client.body import read_tensors
from eagle3_target.client.connection import parse_server_timing
from eagle3_target.protocol import encodings, wire
from eagle3_target.protocol.contract import ENCODING_HEADER

SHAPES = {
    # B, S, hidden, vocab, draft vocab: Llama-3.1-8B's supervision for one 2048-token sequence is 312.5 MB.
    "8b": dict(batch=1, seq=2048, hidden=4096, vocab=32000, draft=32000),
    "small": dict(batch=1, seq=512, hidden=2048, vocab=8192, draft=8192),
}
# Small responses take milliseconds, where scheduling noise on a shared VM is large: take more of them.
DEFAULT_REPEATS = {"8b": 9, "small": 27}
COMPUTE_PHASES = ("decode", "forward", "projection", "copy", "encode")


def _tcp_sender(port_queue, nbytes: int, repeats: int) -> None:
    payload = memoryview(bytearray(nbytes))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port_queue.put(listener.getsockname()[1])
        conn, _ = listener.accept()
        with conn:
            for _ in range(repeats):
                conn.recv(1)
                conn.sendall(payload)


@contextlib.contextmanager
def raw_tcp(nbytes: int, transfers: int, fresh: bool = False) -> Iterator[Callable[[], float]]:
    """A sender process ready for ``transfers`` transfers; yields a function that times one: into one
    reused buffer, or into a new buffer each time (``fresh``: what a receiver that keeps the data pays,
    page faults included)."""
    ports = mp.Queue()
    sender = mp.Process(target=_tcp_sender, args=(ports, nbytes, transfers))
    sender.start()
    buf = memoryview(bytearray(nbytes))
    with socket.create_connection(("127.0.0.1", ports.get(timeout=30))) as sock:

        def transfer() -> float:
            start = time.perf_counter()
            into = memoryview(bytearray(nbytes)) if fresh else buf
            sock.sendall(b"x")
            got = 0
            while got < nbytes:
                got += sock.recv_into(into[got:])
            return time.perf_counter() - start

        yield transfer
    sender.join(30)


def nemo_reply_bytes(shape: dict) -> int:
    dims = shape["batch"], shape["seq"], shape["hidden"], shape["draft"], torch.bfloat16
    want = encodings.expected(encodings.NEMO, *dims)
    return wire.EncodedBlob({k: torch.empty(size, dtype=dtype) for k, (dtype, size) in want.items()}).nbytes


def loop_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of a process's main thread: the server's event loop, which sends."""
    with open(f"/proc/{pid}/task/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve(port_queue, shape: dict) -> None:
    from aiohttp import web

    from eagle3_target.server.app import TargetServer
    from eagle3_target.server.runners.synthetic import SyntheticRunner

    async def main():
        server = TargetServer(
            lambda: SyntheticRunner(
                hidden_size=shape["hidden"], vocab_size=shape["vocab"], num_hidden_layers=32, dtype="bfloat16"
            )
        )
        runner = web.AppRunner(server.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_queue.put(runner.addresses[0][1])
        await asyncio.Event().wait()

    asyncio.run(main())


async def http_generate(
    url: str, shape: dict, repeats: int, names: list[str], tcp_transfer: Callable[[], float]
) -> tuple[dict[str, tuple[int, list[float], list[float]]], list[float]]:
    """Per encoding: (response bytes, round-trip seconds, transfer seconds per repeat), and the raw TCP
    seconds. The encodings and one raw TCP transfer take turns within each round, so a change in the
    machine's load hits them all alike."""
    ids = torch.randperm(shape["vocab"])[: shape["draft"]]
    mask = torch.zeros(shape["vocab"], dtype=torch.bool)
    mask[ids] = True
    request = _generate_request(shape, shape["seq"])
    dims = shape["batch"], shape["seq"], shape["hidden"], shape["draft"], torch.bfloat16
    results, tcp = {name: (0, [], []) for name in names}, []
    async with aiohttp.ClientSession(trust_env=False) as http:
        while True:
            async with http.get(f"{url}/health") as resp:
                if resp.status == 200:
                    break
            await asyncio.sleep(0.1)
        vocab = wire.encode({"selected_token_ids": ids, "selected_token_mask": mask})
        async with http.post(f"{url}/set_vocab_mapping", data=vocab) as resp:
            assert resp.status == 200, await resp.text()
        for _ in range(repeats + 1):  # the first round warms both sides up
            for name in names:
                start = time.perf_counter()
                async with http.post(
                    f"{url}/generate", data=request, headers={ENCODING_HEADER: name}
                ) as resp:
                    assert resp.status == 200, await resp.text()
                    # our own server on loopback: its Content-Length is the read's limit
                    out = await read_tensors(resp, resp.content_length)
                    timing = parse_server_timing(resp.headers["Server-Timing"])
                elapsed = time.perf_counter() - start
                encodings.check(out, encodings.expected(name, *dims))
                _, rounds, transfers = results[name]
                rounds.append(elapsed)
                transfers.append(elapsed - sum(timing[p] for p in COMPUTE_PHASES))
                results[name] = resp.content_length, rounds, transfers
                del out
            tcp.append(tcp_transfer())
    per_encoding = {
        name: (nbytes, rounds[1:], transfers[1:]) for name, (nbytes, rounds, transfers) in results.items()
    }
    return per_encoding, tcp[1:]


def _generate_request(shape: dict, seq: int) -> bytes:
    input_ids = torch.randint(0, shape["vocab"], (shape["batch"], seq))
    ones = torch.ones_like(input_ids)
    return wire.encode({"input_ids": input_ids, "attention_mask": ones, "loss_mask": ones})


def _memory_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def _rss_child(url: str, shape: dict, client: str, results) -> None:
    """In a fresh process: warm up on a 16-token reply, then the peak RSS above that baseline while one
    full reply is received and held as tensors."""

    def fetch_nemo(request: bytes):
        import requests
        from nemo_automodel.components.speculative.eagle.remote import wire as nemo_wire

        with requests.Session() as session:
            session.trust_env = False
            resp = session.post(f"{url}/generate", data=request, timeout=300)
            resp.raise_for_status()
            return nemo_wire.decode(resp.content, map_location="cpu")

    async def fetch_ours(request: bytes):
        async with (
            aiohttp.ClientSession(trust_env=False) as http,
            http.post(f"{url}/generate", data=request) as resp,
        ):
            assert resp.status == 200, await resp.text()
            return await read_tensors(resp, resp.content_length)

    def fetch(seq: int):
        request = _generate_request(shape, seq)
        return fetch_nemo(request) if client == "nemo" else asyncio.run(fetch_ours(request))

    fetch(16)
    baseline = _memory_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets VmHWM to the current RSS
    reply = fetch(shape["seq"])
    results.put((baseline, _memory_kb("VmHWM"), sum(t.numel() * t.element_size() for t in reply.values())))


def client_peak_rss(url: str, shape: dict, client: str) -> tuple[int, int] | None:
    """(peak RSS above baseline, tensor bytes held) in bytes for one reply; None without NeMo's client."""
    if client == "nemo":
        try:
            import nemo_automodel.components.speculative.eagle.remote.wire  # noqa: F401
        except ImportError:
            return None
    results = mp.Queue()
    child = mp.Process(target=_rss_child, args=(url, shape, client, results))
    child.start()
    baseline, peak, held = results.get(timeout=300)
    child.join(30)
    return (peak - baseline) * 1024, held


def nemo_client_transfer_seconds(url: str, shape: dict, repeats: int) -> list[float] | None:
    """NeMo's trainer-side receive path against our server: requests' .content, then NeMo's wire.decode."""
    try:
        import requests
        from nemo_automodel.components.speculative.eagle.remote import wire as nemo_wire
    except ImportError:
        return None
    session = requests.Session()
    session.trust_env = False
    request = _generate_request(shape, shape["seq"])
    # The session is named by the peer address, which the aiohttp client above shares: the mapping is set.
    transfers = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        resp = session.post(f"{url}/generate", data=request, timeout=300)
        resp.raise_for_status()
        nemo_wire.decode(resp.content, map_location="cpu")
        elapsed = time.perf_counter() - start
        timing = parse_server_timing(resp.headers["Server-Timing"])
        transfers.append(elapsed - sum(timing[p] for p in COMPUTE_PHASES))
    return transfers[1:]


def encoding_rows(name: str, shape: dict, chosen: list, measured: dict, tcp: float) -> list[tuple]:
    """(shape, encoding, bytes/token, tokens/s, x nemo, x raw TCP) for raw TCP and each chosen encoding."""
    tokens = shape["batch"] * shape["seq"]
    nemo_tps, tcp_tps = tokens / statistics.median(measured[encodings.NEMO][2]), tokens / tcp
    rows = [(name, "raw TCP", measured[encodings.NEMO][0] / tokens, tcp_tps, tcp_tps / nemo_tps, 1.0)]
    for encoding in chosen:
        size, _, times = measured[encoding]
        tps = tokens / statistics.median(times)
        rows.append((name, encoding, size / tokens, tps, tps / nemo_tps, tps / tcp_tps))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, help="transfers per shape (default: 9 for 8b, 27 for small)")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument(
        "--encoding",
        nargs="+",
        choices=encodings.ENCODINGS,
        help="also time these supervision encodings and compare their tokens/s with nemo's",
    )
    args = parser.parse_args()
    mp.set_start_method("spawn")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"torch {torch.__version__}, {mp.cpu_count()} CPUs, load average {load}; medians")
    print(
        f"{'shape':6} {'MB/resp':>8} {'raw TCP MB/s':>13} {'HTTP wire MB/s':>15} {'ratio':>6} "
        f"{'end-to-end MB/s':>16} {'NeMo client MB/s':>17} {'ratio':>6} {'raw TCP fresh MB/s':>19} "
        f"{'server loop CPU ms/100 MB':>26}"
    )
    per_encoding, rss = [], []
    for name in args.shapes:
        shape, repeats = SHAPES[name], args.repeats or DEFAULT_REPEATS[name]
        ports = mp.Queue()
        server = mp.Process(target=_serve, args=(ports, shape), daemon=True)
        server.start()
        try:
            url = f"http://127.0.0.1:{ports.get(timeout=120)}"
            names = [encodings.NEMO, *(e for e in args.encoding or [] if e != encodings.NEMO)]
            with raw_tcp(nemo_reply_bytes(shape), repeats + 1) as tcp_transfer:
                cpu = loop_cpu_seconds(server.pid)
                measured, tcp_times = asyncio.run(http_generate(url, shape, repeats, names, tcp_transfer))
                cpu = loop_cpu_seconds(server.pid) - cpu
            sent = sum(size * len(times) for size, times, _ in measured.values())
            nbytes, rounds, transfers = measured[encodings.NEMO]
            assert nbytes == nemo_reply_bytes(shape)
            nemo = nemo_client_transfer_seconds(url, shape, max(3, repeats // 3))
            rss.append(
                (name, nbytes, client_peak_rss(url, shape, "ours"), client_peak_rss(url, shape, "nemo"))
            )
        finally:
            server.kill()
        tcp = statistics.median(tcp_times)
        with raw_tcp(nbytes, repeats, fresh=True) as tcp_transfer:
            tcp_fresh = statistics.median(tcp_transfer() for _ in range(repeats))
        mb = nbytes / 1e6
        wire_rate, tcp_rate = mb / statistics.median(transfers), mb / tcp
        nemo_rate = mb / statistics.median(nemo) if nemo else float("nan")
        print(
            f"{name:6} {mb:8.1f} {tcp_rate:13.0f} {wire_rate:15.0f} {wire_rate / tcp_rate:6.2f} "
            f"{mb / statistics.median(rounds):16.0f} {nemo_rate:17.0f} {nemo_rate / tcp_rate:6.2f} "
            f"{mb / tcp_fresh:19.0f} {1e3 * cpu / (sent / 1e8):26.1f}"
        )
        if args.encoding:
            per_encoding += encoding_rows(name, shape, args.encoding, measured, tcp)
    print_footprints(rss, per_encoding)


def print_footprints(rss: list, per_encoding: list) -> None:
    """The client's peak memory per shape, then each encoding's tokens/s against nemo's and raw TCP."""
    print(
        f"\n{'shape':6} {'MB/resp':>8} {'client peak RSS MB':>19} {'x resp':>7} {'NeMo client MB':>15} {'x resp':>7}"
    )
    for name, nbytes, ours, nemo in rss:
        nemo_mb, nemo_x = (nemo[0] / 1e6, nemo[0] / nbytes) if nemo else (float("nan"),) * 2
        print(
            f"{name:6} {nbytes / 1e6:8.1f} {ours[0] / 1e6:19.1f} {ours[0] / nbytes:7.2f} "
            f"{nemo_mb:15.1f} {nemo_x:7.2f}"
        )
    if per_encoding:
        print(f"\n{'shape':6} {'encoding':9} {'B/token':>9} {'tokens/s':>10} {'x nemo':>7} {'x raw TCP':>10}")
        for name, encoding, per_token, tps, vs_nemo, vs_tcp in per_encoding:
            print(f"{name:6} {encoding:9} {per_token:9.0f} {tps:10.0f} {vs_nemo:7.2f} {vs_tcp:10.2f}")


if __name__ == "__main__":
    main()
