"""What a person (or Prometheus) sees of a run: a tqdm bar on a terminal, else a log line every
``--log-interval`` seconds; counters in a textfile (node-exporter style) or on a port; a final summary."""

from __future__ import annotations

import logging
import sys
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server, write_to_textfile
from tqdm import tqdm

log = logging.getLogger("eagle3_target.precompute")


class Progress:
    def __init__(
        self,
        planned: int,
        *,
        worker: str,
        log_interval: float = 30.0,
        metrics_file: str | None = None,
        metrics_port: int | None = None,
    ):
        self.planned, self.worker, self.log_interval = planned, worker, log_interval
        self.samples = self.tokens = self.bytes = self.shards = 0
        self.wall = 0.0  # seconds from the first request to the last shard, once closed
        self.started = self._logged = time.monotonic()
        self.metrics_file = metrics_file
        self.registry = CollectorRegistry()
        self._samples = Counter("eagle3_precompute_samples", "samples written", registry=self.registry)
        self._tokens = Counter("eagle3_precompute_tokens", "attended tokens written", registry=self.registry)
        self._bytes = Counter("eagle3_precompute_bytes", "shard bytes written", registry=self.registry)
        self._shards = Counter("eagle3_precompute_shards", "shards written", registry=self.registry)
        Gauge("eagle3_precompute_planned_samples", "samples this worker owns", registry=self.registry).set(
            planned
        )
        # Scraped while the run lasts (a Job's pod), closed with it.
        self.http = (
            start_http_server(metrics_port, registry=self.registry) if metrics_port is not None else None
        )
        self.bar = (
            tqdm(total=planned, unit="sample", dynamic_ncols=True, desc=f"precompute {worker}")
            if sys.stderr.isatty()
            else None
        )

    def batch(self, samples: int, tokens: int) -> None:
        self.samples += samples
        self.tokens += tokens
        self._samples.inc(samples)
        self._tokens.inc(tokens)
        if self.bar is not None:
            self.bar.update(samples)
            self.bar.set_postfix_str(self.rates(), refresh=False)
        elif time.monotonic() - self._logged >= self.log_interval:
            self._logged = time.monotonic()
            log.info("%d/%d samples, %s", self.samples, self.planned, self.rates())
            self.export()

    def shard(self, size: int) -> None:
        self.shards += 1
        self.bytes += size
        self._shards.inc()
        self._bytes.inc(size)

    def rates(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return f"{self.tokens / elapsed:,.0f} tokens/s, {self.bytes / elapsed / 1e6:,.1f} MB/s"

    def export(self) -> None:
        if self.metrics_file:
            write_to_textfile(self.metrics_file, self.registry)  # itself written to a temp file and renamed

    def close(self) -> None:
        """Stop the bar, write the counters a last time, log the summary."""
        if self.bar is not None:
            self.bar.close()
        if self.http is not None:
            self.http[0].shutdown()
        self.export()
        self.wall = time.monotonic() - self.started
        log.info("%s", self.summary())

    def summary(self) -> str:
        return (
            f"precompute {self.worker}: {self.samples} samples, {self.shards} shards, "
            f"{self.bytes:,} bytes in {self.wall:.1f} s ({self.samples / max(self.wall, 1e-9):.2f} samples/s)"
        )
