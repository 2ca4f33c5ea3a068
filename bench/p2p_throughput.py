"""Wire versus point-to-point /generate throughput, same server, same shape, same run.

Starts one synthetic target server process (any hidden size and vocabulary, no model),
then pulls the same batches through the client twice: over the wire format and over
the point-to-point group (gloo on a CPU server, NCCL on a GPU server), and prints MB/s
of supervision received and the ratio p2p / wire.

    python bench/p2p_throughput.py --hidden 1024 --vocab 8192 --seq-len 2048 --batches 10
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import socket
import time
import urllib.request

import torch

from eagle3_target.client import PoolOptions, RemoteTargetBackend
from eagle3_target.client.bench import measure


def serve(port: int, hidden: int, vocab: int, device: str) -> None:
    from eagle3_target.server.app import TargetServer
    from eagle3_target.server.options import ServerOptions
    from eagle3_target.server.p2p.options import P2POptions, PortRange
    from eagle3_target.server.process import listen, run_server
    from eagle3_target.server.runners.synthetic import SyntheticRunner

    logging.basicConfig(level=logging.WARNING)
    options = ServerOptions(p2p=P2POptions(port_range=PortRange(port + 100, port + 163)))
    loader = lambda: SyntheticRunner(hidden_size=hidden, vocab_size=vocab, dtype="auto", device=device)  # noqa: E731
    run_server(TargetServer(loader, options), listen("127.0.0.1", port))


def wait_ready(url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not become ready")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument(
        "--vocab", type=int, default=8192, help="target vocabulary; the draft vocabulary is all of it"
    )
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--device", default="cpu", help="the server's device (cuda:0 makes the p2p path NCCL)")
    args = p.parse_args()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    server = ctx.Process(target=serve, args=(port, args.hidden, args.vocab, args.device), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url)
        results = {}
        for path in ("wire", "p2p"):
            with RemoteTargetBackend(url, options=PoolOptions(data_path=path)) as backend:
                backend.set_vocab_mapping(torch.arange(args.vocab), torch.ones(args.vocab, dtype=torch.bool))
                results[path] = measure(
                    backend, args.batch_size, args.seq_len, args.batches, warmup=2, depth=1
                )
                channel = next(iter(backend.pool.members.values())).agreement.p2p  # None over the wire
                counts = (
                    f"  [p2p transfers {channel.transfers}, fallbacks {channel.fallbacks}]" if channel else ""
                )
                print(f"{path:>4}: {results[path]}{counts}")
        wire, p2p = (r.decoded_bytes / r.seconds for r in (results["wire"], results["p2p"]))
        per_batch = results["wire"].decoded_bytes / results["wire"].batches / 1e6
        print(
            f"shape B={args.batch_size} S={args.seq_len} hidden={args.hidden} vocab={args.vocab} "
            f"({per_batch:.1f} MB/batch); p2p / wire throughput = {p2p / wire:.2f}x"
        )
    finally:
        server.terminate()
        server.join(10)


if __name__ == "__main__":
    main()
