"""Precompute scaling: `eagle3-target precompute` against N synthetic servers with a fixed forward delay.

Each server can do at most batch_size / forward_delay samples/s, so ideal throughput is N times the
single-server figure; ratio = tput(N) / (N * tput(1)), both measured in this run (target: >= 0.9).
Also prints bytes per sample, and with --memory the peak RSS of a precompute process for two dataset
sizes (the shards are streamed: memory should not grow with the dataset).

    python bench/precompute_scaling.py                 # samples/s with 1, 2 and 4 servers
    python bench/precompute_scaling.py --memory        # peak RSS for 64 and 512 samples, 2 servers
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from client_scaling import subprocess_servers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tiny tokenizer and chats the tests build

from nemo.nemo_support import build_target, write_chats  # noqa: E402
from precompute.precompute_support import synthetic_target  # noqa: E402

from eagle3_target.client.precompute.eagle3 import precompute_eagle3  # noqa: E402
from eagle3_target.client.precompute.options import add_arguments  # noqa: E402


def command(urls: list[str], model: Path, chats: Path, out: Path, args) -> list[str]:
    return [
        *("--endpoints", ",".join(urls), "--target-model", str(model), "--input-data", str(chats)),
        *(
            "--output-dir",
            str(out),
            "--seq-length",
            str(args.seq_length),
            "--batch-size",
            str(args.batch_size),
        ),
        *(
            "--shard-size",
            str(args.shard_size),
            "--draft-vocab-size",
            str(args.draft_vocab),
            "--dtype",
            "bf16",
        ),
        *("--max-in-flight", str(args.max_in_flight), "--skip-config-digest", "--log-interval", "3600"),
    ]


def fixture(root: Path, samples: int) -> tuple[Path, Path]:
    model = synthetic_target(root / "synthetic", build_target(root / "tiny"))
    return model, write_chats(root / f"chats-{samples}.jsonl", samples)


def scaling(args, root: Path) -> None:
    counts = [int(c) for c in args.counts.split(",")]
    samples = args.samples_per_server * max(counts)
    model, chats = fixture(root, samples)
    print("| servers | samples | samples/s | ratio | bytes/sample |")
    print("|---|---|---|---|---|")
    base = None
    for count in counts:
        with subprocess_servers(count, args.forward_delay) as urls:
            parser = argparse.ArgumentParser()
            add_arguments(parser)
            run = parser.parse_args(command(urls, model, chats, root / f"cache-{count}", args))
            progress = precompute_eagle3(run, None)
        rate = progress.samples / progress.wall
        base = base or rate
        ratio = rate / (count * base)
        per_sample = progress.bytes / progress.samples
        print(f"| {count} | {progress.samples} | {rate:.1f} | {ratio:.3f} | {per_sample:,.0f} |", flush=True)


def peak_rss(args, root: Path, samples: int, urls: list[str]) -> tuple[int, int]:
    """Peak RSS (bytes) of a precompute process over ``samples`` samples, and the cache's shard bytes."""
    model, chats = fixture(root / str(samples), samples)
    out = root / f"rss-{samples}"
    cli = [sys.executable, "-m", "eagle3_target.cli", "--log-level", "WARNING", "precompute"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [*cli, *command(urls, model, chats, out, args)], env=env, stdout=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    written = sum(p.stat().st_size for p in out.glob("shard-*.safetensors"))
    return usage.ru_maxrss * 1024, written


def memory(args, root: Path) -> None:
    (root / "64").mkdir()
    (root / "512").mkdir()
    print("| samples | cache (shards) | peak RSS | shard size |")
    print("|---|---|---|---|")
    with subprocess_servers(2, 0.0) as urls:
        for samples in (64, 512):
            rss, written = peak_rss(args, root, samples, urls)
            shard = written * args.shard_size // samples
            print(
                f"| {samples} | {written / 1e6:.1f} MB | {rss / 1e6:.0f} MB | {shard / 1e6:.1f} MB |",
                flush=True,
            )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--counts", default="1,2,4", help="server counts (default 1,2,4)")
    p.add_argument("--forward-delay", type=float, default=0.1, help="seconds per forward (default 0.1)")
    p.add_argument(
        "--samples-per-server", type=int, default=256, help="samples for the largest N, per server"
    )
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--shard-size", type=int, default=32)
    p.add_argument("--seq-length", type=int, default=128)
    p.add_argument("--draft-vocab", type=int, default=256)
    p.add_argument("--max-in-flight", type=int, default=2)
    p.add_argument("--memory", action="store_true", help="peak RSS for two dataset sizes instead")
    args = p.parse_args()
    torch.set_num_threads(1)
    print(
        f"# {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}, torch {torch.__version__}"
    )
    print(f"# {' '.join(sys.argv)}")
    with tempfile.TemporaryDirectory() as tmp:
        (memory if args.memory else scaling)(args, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
