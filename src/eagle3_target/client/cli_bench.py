"""`eagle3-target bench`: synthetic batches of one shape through the client; batches/s, tokens/s, MB/s."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from eagle3_target.protocol import encodings

from .backend import RemoteTargetBackend
from .cli_probe import describe, probe, read_token
from .dispatch import BatchFailedError, PoolOptions
from .endpoints import EndpointError
from .p2p import DATA_PATHS

log = logging.getLogger(__name__)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("endpoints", nargs="?", help="endpoint spec (default: $EAGLE3_TARGET_SERVICE)")
    p.add_argument("--nameserver", help="DNS server host[:port] (default: the system's)")
    p.add_argument("--auth-token-file", type=Path, help="default: $EAGLE3_TARGET_AUTH_TOKEN_FILE")
    p.add_argument("--batch-size", type=positive_int, default=1)
    p.add_argument("--seq-len", type=positive_int, default=2048)
    p.add_argument(
        "--draft-vocab", type=positive_int, help="draft vocabulary size (default: the full target vocab)"
    )
    p.add_argument("--batches", type=positive_int, default=50, help="timed batches (default 50)")
    p.add_argument("--warmup", type=int, default=3, help="untimed batches first (default 3)")
    p.add_argument(
        "--depth",
        type=positive_int,
        help="requests in flight (default and cap: healthy servers x --max-in-flight)",
    )
    p.add_argument("--max-in-flight", type=positive_int, default=1, help="requests per server (default 1)")
    p.add_argument(
        "--resolve-timeout", type=float, default=10.0, help="seconds to wait for the name (default 10)"
    )
    p.add_argument(
        "--start-timeout",
        type=float,
        default=120.0,
        help="seconds for a reachable but loading server to become ready (default 120)",
    )
    p.add_argument(
        "--settle-timeout",
        type=float,
        default=60.0,
        help="seconds to wait for every server found to join before measuring (default 60)",
    )
    p.add_argument(
        "--encoding",
        choices=encodings.CHOICES,
        default=encodings.AUTO,
        help="supervision encoding (default auto: the most compact exact one each server offers)",
    )
    p.add_argument(
        "--data-path",
        choices=DATA_PATHS,
        default="auto",
        help="wire, p2p (point-to-point; gloo on CPU servers) or auto (GPU-direct when possible)",
    )


@dataclass
class Throughput:
    batches: int
    tokens: int
    nbytes: int
    seconds: float

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.seconds

    def __str__(self) -> str:
        return (
            f"{self.batches_per_s:.2f} batches/s, {self.tokens / self.seconds:,.0f} tokens/s, "
            f"{self.nbytes / self.seconds / 1e6:,.1f} MB/s ({self.batches} batches in {self.seconds:.2f}s)"
        )


def measure(
    backend: RemoteTargetBackend,
    batch_size: int,
    seq_len: int,
    batches: int,
    warmup: int = 3,
    depth: int | None = None,
) -> Throughput:
    """Stream ``warmup + batches`` random batches through ``backend.prefetch``; the clock starts when the
    last warm-up batch arrives (at least one: the pipeline is full by then) and stops at the last batch."""
    warmup = max(1, warmup)
    vocab = backend.model_info()["vocab_size"]
    ids = torch.randint(0, vocab, (batch_size, seq_len), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    nbytes, start = 0, 0.0
    stream = backend.prefetch(((ids, mask, mask) for _ in range(warmup + batches)), depth)
    # The bar goes to stderr and only to a terminal: stdout keeps the one result line.
    for index, batch in enumerate(tqdm(stream, total=warmup + batches, unit="batch", disable=None)):
        if index == warmup - 1:
            start = time.perf_counter()
        elif index >= warmup:
            nbytes += sum(
                t.numel() * t.element_size() for k, t in batch.as_dict().items() if k != "attention_mask"
            )
    return Throughput(batches, batches * ids.numel(), nbytes, time.perf_counter() - start)


def check_reachable(args: argparse.Namespace, token: str | None) -> None:
    """Probe every server the spec names before the run: none reachable is an error now, not after
    the start timeout; some unreachable is a warning."""
    reports = asyncio.run(
        probe(args.endpoints, nameserver=args.nameserver, token=token, resolve_timeout=args.resolve_timeout)
    )
    unauthorized = [r for r in reports if r["state"] == "unauthorized"]
    if unauthorized:
        raise SystemExit(f"eagle3-target bench: error: {describe(unauthorized[0])}")
    down = [r for r in reports if r["state"] == "down"]
    if len(down) == len(reports):
        raise SystemExit(
            "eagle3-target bench: error: no target server is reachable: " + "; ".join(map(describe, down))
        )
    for report in down:
        log.warning("unreachable, benchmarking without it: %s", describe(report))


def run(args: argparse.Namespace) -> int:
    token = read_token(args.auth_token_file)
    try:
        check_reachable(args, token)
    except EndpointError as exc:
        print(f"eagle3-target bench: error: {exc}", file=sys.stderr)
        return 2
    options = PoolOptions(
        max_in_flight=args.max_in_flight,
        data_path=args.data_path,
        start_timeout=args.start_timeout,
        encoding=args.encoding,
    )
    try:
        return bench(args, token, options)
    except BatchFailedError as exc:
        print(f"eagle3-target bench: error: {exc}", file=sys.stderr)
        return 1


def bench(args: argparse.Namespace, token: str | None, options: PoolOptions) -> int:
    with RemoteTargetBackend(
        args.endpoints, auth_token=token, nameserver=args.nameserver, options=options
    ) as backend:
        info = backend.model_info()
        vocab = info["vocab_size"]
        draft = args.draft_vocab or vocab
        mask = torch.zeros(vocab, dtype=torch.bool)
        mask[:draft] = True
        backend.set_vocab_mapping(torch.arange(draft), mask)
        joined, found = backend.wait_for_servers(args.settle_timeout), len(backend.pool.members)
        if joined < found:
            log.warning(
                "only %d of the %d servers found joined within %.0fs: %s",
                joined,
                found,
                args.settle_timeout,
                backend.pool.describe_members(),
            )
        print(
            f"{joined} servers, model {info.get('model', '?')}, "
            f"B={args.batch_size} S={args.seq_len} draft vocab {draft}, "
            f"encoding {', '.join(sorted(set(backend.encodings.values())))}"
        )
        print(measure(backend, args.batch_size, args.seq_len, args.batches, args.warmup, args.depth))
    return 0
