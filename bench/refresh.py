"""In-place weight refresh against a restart: how long `POST /weights/refresh` takes to serve new weights, and
how much host memory it takes, beside what a restart of the same server costs, both measured in this run.

One `eagle3-target serve --engine hf` (on --device in --dtype, float32 on CPU by default; --threads torch
threads; --admin-token-file) serves weights A; 2 x --repeats times it is refreshed from a local safetensors
folder, to weights B and back to A, each under a new label: first --repeats times with its memory sampled
("sampled" rows), then --repeats times timed with no sampler running ("refresh" rows: the medians are theirs;
a thread reading /proc every 2 ms slows a refresh of tens of milliseconds by several). One baseline is a
restart: a fresh `serve` of B in a process of its own, timed from its start to its first 200 on /health
(imports, load, warm-up and the start-up version digest), --repeats times. The other is the bare copy:
safetensors' `load_file` and `load_state_dict` of the same weights into a model this process holds on the same
device in the same dtype, at the servers' threads (on CUDA, until the copies to the device are done). All read
checkpoints the page cache already holds. Printed: the medians, `refresh/restart time` and `refresh/bare load
time`. Memory is the host's: on a GPU the staged copy is host memory and the swap copies into the served
tensors in place.

Memory: the serving process's RSS (VmRSS of /proc/<pid>/status) before each refresh, and its peak during it
(VmHWM, reset through /proc/<pid>/clear_refs just before), with how far its anonymous and file-backed parts
rose in the sampled ones (RssAnon, RssFile, sampled every 2 ms), as MB and as ratios to the RSS before and to
the checkpoint's size on disk; also each restarted server's peak (VmHWM) when it became ready.

Correctness in passing: after each refresh /model_info's target_version is the new label, and a /generate
answers under it with the bytes a fresh server of the same weights answers (the first restart's reply for B).
The model is a Llama of the embedded tiny one's build (`build_tiny_llama`) at --hidden-size, --layers;
the default is about 200 MB of float32.

    python bench/refresh.py                               # hidden 768, 8 layers (~200 MB), 5 repeats
    python bench/refresh.py --hidden-size 1024 --layers 8 --repeats 5
    python bench/refresh.py --smoke                       # a seconds-long run at the embedded tiny shape
    python bench/refresh.py --device cuda:0 --dtype bfloat16 --hidden-size 4096 --layers 8   # a lent GPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import torch

from eagle3_target.protocol import contract, wire
from eagle3_target.server.runners.tiny import TINY_LLAMA, build_tiny_llama, build_tiny_tokenizer

ADMIN, TRAINER = "bench-admin", "bench-trainer"
MB = 1 << 20
VOCAB = TINY_LLAMA["vocab_size"]
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status(pid: int) -> dict[str, int]:
    """The memory lines of /proc/<pid>/status in bytes (VmRSS, VmHWM, RssAnon, RssFile, ...)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if value.strip().endswith(" kB"):
            fields[name] = int(value.split()[0]) << 10
    return fields


def post(url: str, body: bytes, token: str, timeout: float = 600) -> tuple[dict, bytes]:
    """(headers, body) of a 200 reply; anything else ends the bench with the server's words."""
    request = urllib.request.Request(url, data=body, headers={"Authorization": f"Bearer {token}"})
    try:
        with OPENER.open(request, timeout=timeout) as resp:
            return dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"{url}: HTTP {exc.code} {exc.read().decode()}") from None


class Server:
    """`eagle3-target serve` of one folder in a process of its own, and its seconds from start to ready."""

    def __init__(self, model: Path, tokens: Path, args: argparse.Namespace):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "eagle3_target.cli", "--log-level", "WARNING", "serve", "--engine", "hf"]
        cmd += ["--model", str(model), "--device", args.device, "--dtype", args.dtype]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--auth-token-file", str(tokens / "trainer"), "--admin-token-file", str(tokens / "admin")]
        start = time.perf_counter()
        self.proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
        self.ready_s = self._wait_ready(start)

    def _wait_ready(self, start: float) -> float:
        deadline = start + 600
        while True:
            with contextlib.suppress(OSError), OPENER.open(self.url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return time.perf_counter() - start
            if self.proc.poll() is not None or time.perf_counter() > deadline:
                self.stop()
                raise SystemExit(f"the server of {self.url} did not become ready")
            time.sleep(0.02)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)

    def version(self) -> str:
        return json.loads(post(self.url + "/model_info", b"{}", TRAINER)[1])["target_version"]

    def answer(self) -> tuple[str, bytes]:
        """(version header, reply body) of one /generate of a fixed batch, after a vocabulary mapping."""
        ids = torch.arange(64)
        mapping = {"selected_token_ids": ids, "selected_token_mask": torch.arange(VOCAB) < len(ids)}
        post(self.url + "/set_vocab_mapping", wire.encode(mapping), TRAINER)
        batch = torch.arange(64).view(2, 32)
        body = {
            "input_ids": batch,
            "attention_mask": torch.ones_like(batch),
            "loss_mask": torch.ones_like(batch),
        }
        headers, reply = post(self.url + "/generate", wire.encode(body), TRAINER)
        return headers[contract.TARGET_VERSION_HEADER], reply


@contextlib.contextmanager
def sampled(pid: int) -> Iterator[dict[str, int]]:
    """The largest RssAnon and RssFile seen while the block runs, every 2 ms."""
    peaks = {"RssAnon": 0, "RssFile": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError):
                now = status(pid)
                for name in peaks:
                    peaks[name] = max(peaks[name], now.get(name, 0))
            done.wait(0.002)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peaks
    finally:
        done.set()
        thread.join()


def refresh(server: Server, source: Path, version: str, sample: bool) -> dict[str, float]:
    """One refresh, timed, with the serving process's RSS before, its peak during and its RSS after; with
    ``sample``, also how far its anonymous and file-backed parts rose (a sampler perturbs the timing)."""
    pid = server.proc.pid
    before = status(pid)
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS, so the peak is this refresh's
    body = json.dumps({"source": str(source), "version": version}).encode()
    with sampled(pid) if sample else contextlib.nullcontext({}) as parts:
        start = time.perf_counter()
        _, reply = post(server.url + "/weights/refresh", body, ADMIN)
        seconds = time.perf_counter() - start
    if json.loads(reply) != {"version": version}:
        raise SystemExit(f"the refresh to {version} answered {reply!r}")
    after = status(pid)
    grown = {f"+{name}": peak - before[name] for name, peak in parts.items()}
    return {"s": seconds, "before": before["VmRSS"], "peak": after["VmHWM"], "after": after["VmRSS"], **grown}


def check(server: Server, version: str, expected: bytes) -> None:
    """The new label on /model_info and on a /generate whose bytes are the fresh load's of those weights."""
    if server.version() != version:
        raise SystemExit(f"/model_info names {server.version()}, not {version}")
    named, reply = server.answer()
    if named != version or reply != expected:
        raise SystemExit(
            f"after the refresh to {version} /generate answered under {named}, equal: {reply == expected}"
        )


def checkpoint(folder: Path, seed: int, shape: dict) -> int:
    """A Llama of ``shape`` saved as safetensors in ``folder``, with the tiny tokenizer (a restart loads one
    too); the weights' size on disk in bytes."""
    build_tiny_llama(seed=seed, **shape).save_pretrained(folder)
    build_tiny_tokenizer().save_pretrained(folder)
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def restarts(b: Path, tokens: Path, args) -> tuple[list[float], list[int], bytes]:
    """Each restart's seconds to ready and peak RSS, and the first one's /generate reply (weights B)."""
    seconds, peaks, reply = [], [], b""
    for _ in range(args.repeats):
        server = Server(b, tokens, args)
        try:
            seconds.append(server.ready_s)
            peaks.append(status(server.proc.pid)["VmHWM"])
            reply = reply or server.answer()[1]
        finally:
            server.stop()
    return seconds, peaks, reply


def refreshes(folders: dict[str, Path], tokens: Path, args, expected_b: bytes):
    """The server of A refreshed 2 x --repeats times, to B and back to A, each checked under its new label:
    first --repeats with their memory sampled, then --repeats timed with no sampler running. Its version at
    start, and (kind, version, measures) of each refresh."""
    server = Server(folders["a"], tokens, args)
    try:
        started, reply_a = server.answer()
        expected = {"a": reply_a, "b": expected_b}
        rows = []
        for i in range(2 * args.repeats):
            name, kind = "ba"[i % 2], "sampled" if i < args.repeats else "refresh"
            version = f"weights-{name}-{i + 1}"
            rows.append((kind, version, refresh(server, folders[name], version, sample=kind == "sampled")))
            check(server, version, expected[name])
        return started, rows
    finally:
        server.stop()


def bare_loads(folders: dict[str, Path], args) -> list[float]:
    """The other baseline: safetensors' load_file and load_state_dict of the same weights into a model this
    process already holds (torch at the servers' threads), alternating B and A as the refreshes do."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(folders["a"], dtype=getattr(torch, args.dtype))
    model.to(args.device)
    seconds = []
    for i in range(args.repeats):
        files = sorted(folders["ba"[i % 2]].glob("*.safetensors"))
        start = time.perf_counter()
        tensors = {k: v for f in files for k, v in load_file(f).items()}
        result = model.load_state_dict(tensors, strict=False)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()  # the copies to the device are done, as the server's are when it answers
        seconds.append(time.perf_counter() - start)
        assert not result.unexpected_keys and len(result.missing_keys) <= 1, result  # a tied lm_head at most
    return seconds


def table_row(cells: list[str]) -> str:
    """The run's name left, numbers right, the version (refresh rows) last."""
    widths = [9, 9, 8, 9, 10, 10, 10]
    row = cells[0].ljust(widths[0]) + "".join(
        c.rjust(w) for c, w in zip(cells[1:7], widths[1:], strict=False)
    )
    return row + "".join(f"  {c}" for c in cells[7:])


def report(
    rows: list[tuple[str, str, dict]],
    restart_s: list[float],
    restart_peaks: list[int],
    size: int,
    bare: list[float],
) -> None:
    timed = [r for kind, _, r in rows if kind == "refresh"]
    med = {key: statistics.median(r[key] for r in timed) for key in timed[0]}
    restart, restart_peak = statistics.median(restart_s), statistics.median(restart_peaks)
    columns = ["run", "seconds", "RSS MB", "peak MB", "after MB", "+anon MB", "+file MB", "version"]
    print(table_row(columns))
    for kind, version, r in rows:
        keys = ("before", "peak", "after", "+RssAnon", "+RssFile")
        mb = [f"{r[key] / MB:.0f}" if key in r else "" for key in keys]
        print(table_row([kind, f"{r['s']:.2f}", *mb, version]))
    for s, peak in zip(restart_s, restart_peaks, strict=True):
        print(table_row(["restart", f"{s:.2f}", "", f"{peak / MB:.0f}"]))
    grown = med["peak"] - med["before"]
    print(f"checkpoint: {size / MB:.0f} MB")
    print(f"median refresh: {med['s']:.3f} s, median restart: {restart:.2f} s")
    print(f"refresh/restart time: {med['s'] / restart:.3f}")
    print(f"median bare load_file + load_state_dict: {statistics.median(bare):.3f} s")
    print(f"refresh/bare load time: {med['s'] / statistics.median(bare):.2f}")
    print(f"refresh peak/serving RSS: {med['peak'] / med['before']:.2f}")
    print(f"refresh peak - serving RSS: {grown / MB:.0f} MB = {grown / size:.2f} x the checkpoint")
    print(f"after refresh/serving RSS: {med['after'] / med['before']:.2f}")
    print(f"restart peak/refresh peak: {restart_peak / med['peak']:.2f}")


def llama_shape(hidden: int, layers: int) -> dict:
    """The embedded tiny Llama's proportions at ``hidden``: MLP 8/3 wide, heads of 64, two per KV head."""
    heads = max(4, hidden // 64)
    return {
        "hidden_size": hidden,
        "intermediate_size": max(2 * hidden, hidden * 8 // 3 // 64 * 64),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads // 2,
    }


def parse_shape(p: argparse.ArgumentParser, repeats: int, what: str) -> argparse.Namespace:
    """The arguments of both refresh benches (this one and refresh_broadcast.py): the Llama's shape, how many
    repeats, the servers' torch threads; --smoke is the embedded tiny shape, 2 repeats."""
    p.add_argument("--hidden-size", type=int, default=768)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--repeats", type=int, default=repeats, help=what)
    p.add_argument("--threads", type=int, default=1, help="the servers' torch threads (OMP_NUM_THREADS)")
    p.add_argument("--device", default="cpu", help="the servers' torch device, e.g. cuda:0 (default cpu)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument(
        "--smoke", action="store_true", help="the embedded tiny shape (hidden 64, 8 layers), 2 repeats"
    )
    args = p.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: this torch ({torch.__version__}) sees no CUDA device")
    if args.smoke:
        args.hidden_size, args.layers, args.repeats = 64, 8, 2
    return args


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args = parse_shape(p, 5, "refreshes, and restarts, each")
    shape = llama_shape(args.hidden_size, args.layers)
    with tempfile.TemporaryDirectory(prefix="refresh-bench-") as tmp:
        root = Path(tmp)
        (root / "admin").write_text(ADMIN)
        (root / "trainer").write_text(TRAINER)
        folders = {"a": root / "a", "b": root / "b"}
        size = checkpoint(folders["a"], 1, shape)
        checkpoint(folders["b"], 2, shape)
        print(
            f"torch {torch.__version__}, server threads {args.threads}, {args.device} {args.dtype}; Llama hidden "
            f"{args.hidden_size}, {args.layers} layers, {size / MB:.0f} MB of float32 safetensors; "
            f"{2 * args.repeats} refreshes ({args.repeats} sampled, {args.repeats} timed), {args.repeats} restarts"
        )
        restart_s, restart_peaks, expected_b = restarts(folders["b"], root, args)
        started, rows = refreshes(folders, root, args, expected_b)
        bare = bare_loads(folders, args)
    report(rows, restart_s, restart_peaks, size, bare)
    print(f"started as: {started}")
    print("checked: after each refresh /model_info and /generate name the new version, and /generate's bytes")
    print("are a fresh server's of those weights")


if __name__ == "__main__":
    main()
