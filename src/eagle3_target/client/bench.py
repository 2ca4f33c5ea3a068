"""Synthetic batches of one shape through the client: batches/s, tokens/s, and the bytes they cost, decoded
and on the wire (`eagle3-target bench`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from prometheus_client.parser import text_string_to_metric_families
from tqdm import tqdm

from eagle3_target.exits import CommandError, Exit

from .backend import RemoteTargetBackend
from .endpoints import EndpointSpec
from .options import PoolOptions
from .probe import describe, probe

log = logging.getLogger(__name__)
LOG_EVERY = 10.0  # seconds between progress lines when stderr is not a terminal


@dataclass
class Throughput:
    batches: int
    tokens: int
    decoded_bytes: int  # the supervision tensors as the trainer holds them
    seconds: float
    wire_bytes: int | None = None  # what the servers sent for the same batches, when their metrics say

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.seconds

    def __str__(self) -> str:
        line = (
            f"{self.batches_per_s:.2f} batches/s, {self.tokens / self.seconds:,.0f} tokens/s, "
            f"decoded {self.decoded_bytes / self.seconds / 1e6:,.1f} MB/s"
        )
        if self.wire_bytes is not None:
            share = self.wire_bytes / self.decoded_bytes if self.decoded_bytes else float("nan")
            line += f", wire {self.wire_bytes / self.seconds / 1e6:,.1f} MB/s ({share:.0%} of decoded)"
        return line + f" ({self.batches} batches in {self.seconds:.2f}s)"


def progress(items: Iterable, total: int, desc: str) -> Iterator:
    """tqdm's bar on a terminal; elsewhere (a Job's log) an INFO line every LOG_EVERY seconds."""
    if sys.stderr.isatty():
        yield from tqdm(items, total=total, desc=desc, unit="batch")
        return
    last = time.monotonic()
    for done, item in enumerate(items, 1):
        yield item
        if done == total or time.monotonic() - last >= LOG_EVERY:
            log.info("%s: %d/%d batches", desc, done, total)
            last = time.monotonic()


def sent_bytes(urls: Iterable[str]) -> int | None:
    """The supervision bytes these servers have sent so far (their eagle3_target_sent_bytes_total), or
    None when one of them does not say (a stock NeMo server has no /metrics)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    total = 0.0
    for url in urls:
        try:
            with opener.open(f"{url}/metrics", timeout=5) as response:
                text = response.read().decode()
        except OSError:
            return None
        for family in text_string_to_metric_families(text):
            if family.name == "eagle3_target_sent_bytes":
                total += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return int(total)


def measure(
    backend: RemoteTargetBackend,
    batch_size: int,
    seq_len: int,
    batches: int,
    warmup: int = 3,
    depth: int | None = None,
) -> Throughput:
    """Stream ``warmup + batches`` random batches through ``backend.prefetch``; the clock starts when the
    last warm-up batch arrives (at least one: the pipeline is full by then) and stops at the last batch.
    Bytes are per batch over the whole run, so pipelining cannot shift them between warm-up and count."""
    warmup = max(1, warmup)
    vocab = backend.model_info()["vocab_size"]
    ids = torch.randint(0, vocab, (batch_size, seq_len), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    servers = list(backend.encodings)
    wire_before = sent_bytes(servers)
    stream = iter(backend.prefetch(((ids, mask, mask) for _ in range(warmup + batches)), depth))
    # Progress goes to stderr: stdout keeps the result lines.
    decoded = sum(map(supervision_bytes, progress((next(stream) for _ in range(warmup)), warmup, "warm-up")))
    start = time.perf_counter()
    decoded += sum(map(supervision_bytes, progress(stream, batches, "batches")))
    seconds = time.perf_counter() - start
    wire_after = sent_bytes(servers)
    per_batch = batches / (warmup + batches)
    wire = (
        None if wire_before is None or wire_after is None else round((wire_after - wire_before) * per_batch)
    )
    return Throughput(batches, batches * ids.numel(), round(decoded * per_batch), seconds, wire)


def supervision_bytes(batch) -> int:
    return sum(t.numel() * t.element_size() for k, t in batch.as_dict().items() if k != "attention_mask")


def check_reachable(
    specs: list[EndpointSpec], nameserver: str | None, token: str | None, timeout: float
) -> None:
    """Probe every server the spec names before the run: none reachable is an error now, not after
    the start timeout; some unreachable is a warning."""
    reports = asyncio.run(probe(specs, nameserver=nameserver, token=token, resolve_timeout=timeout))
    unauthorized = [r for r in reports if r["state"] == "unauthorized"]
    if unauthorized:
        raise CommandError(describe(unauthorized[0]), Exit.UNAUTHORIZED)
    down = [r for r in reports if r["state"] == "down"]
    if len(down) == len(reports):
        raise CommandError(
            "no target server is reachable: " + "; ".join(map(describe, down)), Exit.UNREACHABLE
        )
    for report in down:
        log.warning("unreachable, benchmarking without it: %s", describe(report))


def bench(args: argparse.Namespace, token: str | None, options: PoolOptions) -> None:
    """The run `eagle3-target bench` reports: what joined, then the throughput line."""
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
