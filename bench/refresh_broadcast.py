"""A trainer's weights broadcast against a raw torch.distributed broadcast of the same tensors between the same
processes, both measured in this run.

--replicas replica processes each serve weights A (the real server in-process: `TargetServer`, hf engine,
on --device in --dtype, float32 on CPU by default, --threads torch threads, an admin token and a p2p port
range) and, on a line from this process, also join one world with it for the baseline: gloo on CPU, NCCL on
CUDA, where this process takes cuda:0 and replica i cuda:i (NCCL puts no two ranks on one GPU), so
--replicas N takes N + 1 GPUs. Each repeat first times the raw broadcast:
this process (rank 0) `torch.distributed.broadcast`s every tensor of the next weights to the replicas, which
receive them into buffers they allocated beforehand, then all meet at a barrier (the world was formed once,
before any timing). Then it times `broadcast_refresh` of the same tensors to every replica under a new label,
from the first announcement to the last replica's outcome: the check of names, dtypes and shapes, a fresh
authenticated group per replica, the transfer, the NaN check and the swap. Weights alternate B, A, B, ...
Printed: the medians and `broadcast/raw time`, with the first replica's RSS before, its peak during
(VmHWM, reset through /proc/<pid>/clear_refs) and after each broadcast (host memory: on CUDA the tensors are
received into device memory).

Correctness in passing: after each broadcast every replica's /model_info and /generate name the new label,
every replica answers one /generate with the same bytes, and weights A answer as they did at start-up.

    python bench/refresh_broadcast.py                          # hidden 768, 8 layers (~200 MB), 2 replicas
    python bench/refresh_broadcast.py --replicas 3 --repeats 5
    python bench/refresh_broadcast.py --smoke                  # seconds, at the embedded tiny shape
    python bench/refresh_broadcast.py --device cuda --dtype bfloat16 --replicas 1   # two GPUs
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from refresh import ADMIN, MB, TRAINER, Server, checkpoint, free_port, llama_shape, parse_shape, status
from safetensors import safe_open
from safetensors.torch import load_file

from eagle3_target.client.broadcast import broadcast_refresh
from eagle3_target.protocol.p2p import backend_for

RANGE = 16  # rendezvous ports per replica


class Replica(Server):
    """This script in --replica mode: a server of A, and a member of the raw world on request."""

    def __init__(self, model: Path, args: argparse.Namespace, device: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        ports = free_port_block()
        cmd = [sys.executable, __file__, "--replica", str(model), str(self.port), ports, str(args.threads)]
        cmd += [device, args.dtype]
        start = time.perf_counter()
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.ready_s = self._wait_ready(start)

    def command(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def answered(self) -> str:
        return self.proc.stdout.readline().strip()

    def stop(self) -> None:
        self.proc.stdin.close()
        super().stop()


def free_port_block() -> str:
    """START-END of RANGE ports free now (the server skips any taken later)."""
    while True:
        start = free_port()
        if start + RANGE < 65535:
            return f"{start}-{start + RANGE - 1}"


def raw_world(replicas: list[Replica], device: str) -> float:
    """Seconds to form the world of this process (rank 0) and the replicas, once: gloo on CPU, NCCL on CUDA."""
    port, size = free_port(), len(replicas) + 1
    for rank, replica in enumerate(replicas, 1):
        replica.command(f"world {port} {rank} {size} {device_of(device, rank)}")
    start = time.perf_counter()
    init_world(port, 0, size, device_of(device, 0))
    return time.perf_counter() - start


def device_of(device: str, rank: int) -> str:
    """Rank ``rank``'s device: the CPU for all, or on CUDA a GPU each (NCCL takes no two ranks on one)."""
    return f"cuda:{rank}" if device.startswith("cuda") else "cpu"


def init_world(port: int, rank: int, size: int, device: str) -> None:
    timeout = datetime.timedelta(seconds=300)
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend_for(device),
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=size,
        timeout=timeout,
    )


def raw_broadcast(replicas: list[Replica], tensors: dict[str, torch.Tensor]) -> float:
    """Seconds for rank 0 to broadcast every tensor and for every replica to have received it."""
    for replica in replicas:
        replica.command("receive")
    if any(replica.answered() != "allocated" for replica in replicas):
        raise SystemExit("a replica could not take part in the raw broadcast")
    start = time.perf_counter()
    for tensor in tensors.values():
        dist.broadcast(tensor, src=0)
    dist.barrier()
    return time.perf_counter() - start


def broadcast(replicas: list[Replica], tensors: dict[str, torch.Tensor], version: str) -> dict[str, float]:
    """One timed broadcast_refresh, with the first replica's RSS before, its peak during and after."""
    pid = replicas[0].proc.pid
    before = status(pid)["VmRSS"]
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS, so the peak is this broadcast's
    start = time.perf_counter()
    outcome = broadcast_refresh([r.url for r in replicas], tensors, version, ADMIN)
    seconds = time.perf_counter() - start
    if outcome.refused or set(outcome.served.values()) != {version}:
        raise SystemExit(f"the broadcast of {version}: {outcome}")
    after = status(pid)
    return {"s": seconds, "before": before, "peak": after["VmHWM"], "after": after["VmRSS"]}


def check(replicas: list[Replica], version: str, expected: bytes | None) -> bytes:
    """Every replica names ``version`` and answers alike (as ``expected``, where given); the answer."""
    answers = set()
    for replica in replicas:
        named, reply = replica.answer()
        if replica.version() != version or named != version:
            raise SystemExit(f"{replica.url} names {replica.version()} and {named}, not {version}")
        answers.add(reply)
    if len(answers) != 1 or (expected is not None and answers != {expected}):
        raise SystemExit(f"after {version} the replicas answer {len(answers)} ways, as expected: {expected}")
    return answers.pop()


def run(folders: dict[str, Path], args) -> tuple[float, list[float], list[tuple[str, dict]]]:
    """The world's setup seconds, each raw broadcast's seconds and (version, measures) of each broadcast."""
    tensors = {name: sent(folders[name], args) for name in "ab"}
    replicas = []
    try:
        for rank in range(1, args.replicas + 1):
            replicas.append(Replica(folders["a"], args, device_of(args.device, rank)))
        expected = {"a": replicas[0].answer()[1], "b": None}
        setup = raw_world(replicas, args.device)
        raw, rows = [], []
        for i in range(args.repeats):
            name = "ba"[i % 2]
            version = f"weights-{name}-{i + 1}"
            raw.append(raw_broadcast(replicas, tensors[name]))
            rows.append((version, broadcast(replicas, tensors[name], version)))
            expected[name] = check(replicas, version, expected[name])
        return setup, raw, rows
    finally:
        for replica in replicas:
            replica.stop()


def sent(folder: Path, args: argparse.Namespace) -> dict[str, torch.Tensor]:
    """The tensors the trainer sends, in the served dtype on its device (rank 0's), in checkpoint order."""
    tensors = sorted(load_file(folder / "model.safetensors").items())
    dtype, device = getattr(torch, args.dtype), device_of(args.device, 0)
    return {name: tensor.to(device, dtype) for name, tensor in tensors}


def report(setup: float, raw: list[float], rows: list[tuple[str, dict]], size: int) -> None:
    print(f"{'run':<10}{'seconds':>9}{'RSS MB':>9}{'peak MB':>9}{'after MB':>10}  version")
    for seconds, (version, r) in zip(raw, rows, strict=True):
        print(f"{'raw':<10}{seconds:>9.3f}")
        mb = "".join(f"{r[k] / MB:>{w}.0f}" for k, w in (("before", 9), ("peak", 9), ("after", 10)))
        print(f"{'broadcast':<10}{r['s']:>9.3f}{mb}  {version}")
    ours, theirs = statistics.median(r["s"] for _, r in rows), statistics.median(raw)
    serving = rows[0][1]["before"]  # before the first broadcast: later ones start from what it left
    peak, after = max(r["peak"] for _, r in rows), rows[-1][1]["after"]
    print(f"weights: {size / MB:.0f} MB")
    print(f"raw world setup (once): {setup:.3f} s")
    print(f"median broadcast: {ours:.3f} s, median raw broadcast: {theirs:.3f} s")
    print(f"broadcast/raw time: {ours / theirs:.2f}")
    print(
        f"highest peak - serving RSS: {(peak - serving) / MB:.0f} MB = {(peak - serving) / size:.2f} x the weights"
    )
    print(f"after the last broadcast/serving RSS: {after / serving:.2f}")


def replica(folder: str, port: str, ports: str, threads: str, device: str, dtype: str) -> None:
    """--replica: serve ``folder`` on ``port``; on stdin, join the raw world and receive its broadcasts."""
    import asyncio

    from aiohttp import web

    from eagle3_target.server.app import TargetServer
    from eagle3_target.server.options import ServerOptions
    from eagle3_target.server.p2p.options import P2POptions, PortRange
    from eagle3_target.server.runners.hf import HFRunner

    torch.set_num_threads(int(threads))
    block = PortRange.parse(ports)
    p2p = P2POptions(port=block.start, port_range=block, timeout=600.0, rendezvous_timeout=60.0)
    options = ServerOptions(auth_token=TRAINER, admin_token=ADMIN, p2p=p2p)
    server = TargetServer(lambda: HFRunner.load(folder, device=device, dtype=dtype), options)
    threading.Thread(target=raw_member, args=(Path(folder), getattr(torch, dtype)), daemon=True).start()

    async def serve() -> None:
        runner = server.app_runner()
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", int(port)).start()
        await server.service.stopped.wait()

    asyncio.run(serve())


def raw_member(folder: Path, dtype: torch.dtype) -> None:
    """A replica's part of the raw baseline, one command a line: `world PORT RANK SIZE DEVICE`, then
    `receive`s into buffers of the served dtype on that device."""
    with safe_open(folder / "model.safetensors", framework="pt") as fh:
        layout = {name: fh.get_slice(name) for name in sorted(fh.keys())}  # noqa: SIM118
        shapes = {name: (piece.get_shape(), piece.get_dtype()) for name, piece in layout.items()}
    device = "cpu"
    for line in sys.stdin:
        words = line.split()
        if words[0] == "world":
            device = words[4]
            init_world(*map(int, words[1:4]), device)
        elif words[0] == "receive":
            buffers = [
                torch.empty(shape, dtype=dtype, device=device)
                for shape, kind in shapes.values()
                if kind == "F32"
            ]
            print("allocated" if len(buffers) == len(shapes) else "not float32", flush=True)
            for buffer in buffers:
                dist.broadcast(buffer, src=0)
            dist.barrier()
            del buffers
    os._exit(0)  # stdin closed: the bench is over


def main() -> None:
    if sys.argv[1:2] == ["--replica"]:
        return replica(*sys.argv[2:8])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=2)
    args = parse_shape(p, 5, "raw broadcasts, and broadcast refreshes, each")
    if args.device.startswith("cuda") and torch.cuda.device_count() < args.replicas + 1:
        p.error(f"--device cuda takes a GPU for this process and one per replica: {args.replicas + 1} GPUs")
    with tempfile.TemporaryDirectory(prefix="broadcast-bench-") as tmp:
        folders = {"a": Path(tmp) / "a", "b": Path(tmp) / "b"}
        size = checkpoint(folders["a"], 1, llama_shape(args.hidden_size, args.layers))
        checkpoint(folders["b"], 2, llama_shape(args.hidden_size, args.layers))
        print(
            f"torch {torch.__version__}, replica threads {args.threads}, {args.device} {args.dtype}; Llama hidden "
            f"{args.hidden_size}, {args.layers} layers, {size / MB:.0f} MB of float32; {args.replicas} replicas, "
            f"{args.repeats} repeats"
        )
        setup, raw, rows = run(folders, args)
    sent_size = size * torch.empty(0, dtype=getattr(torch, args.dtype)).element_size() // 4
    report(setup, raw, rows, sent_size)
    print("checked: after each broadcast every replica's /model_info and /generate name the new version, the")
    print("replicas answer alike, and weights A answer as at start-up")


if __name__ == "__main__":
    main()
