"""The target model's lifetime on a server: loaded and warmed in the background on its own thread, then
lent to each request while it is ready (not while loading, not while draining)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from eagle3_target.protocol import encodings
from eagle3_target.protocol.supervision import VocabMapping, build_supervision

from .errors import InvalidInput, NotReady
from .metrics import ServerMetrics
from .runners import HiddenStateRunner, TargetRunner
from .versions import start_version

log = logging.getLogger(__name__)

WARMUP_TOKENS = 8


class ModelHost:
    """The one runner and the one thread all model work runs on, one call at a time."""

    def __init__(self, loader: Callable[[], TargetRunner], metrics: ServerMetrics):
        self.loader, self.metrics = loader, metrics
        self.runner: TargetRunner | None = None
        # The served weights' version: changed on the model thread only, in the same call as the weights
        # (refresh.py), so a forward reads the version of the weights it ran on
        self.version: str | None = None
        self.refreshed_at: float | None = None  # Unix time the latest refresh began serving; None: none yet
        self.load_error: BaseException | None = None
        self.loaded_at = 0  # Unix time the model became ready (OpenAI's model "created")
        self.draining = False  # SIGTERM: finish what is in flight, take nothing new
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="target-model")

    async def load(self) -> bool:
        """Load, check and warm the runner; False (the error kept in load_error) when that fails."""
        start = time.perf_counter()
        try:
            runner = await self.call(self.loader)
            _check_capabilities(runner)
            await self.call(_warm_up, runner)
            self.version = await self.call(start_version, runner)
        except Exception as exc:
            log.exception("loading the target model failed")
            self.load_error = exc
            return False
        self.runner, self.loaded_at = runner, int(time.time())
        elapsed = time.perf_counter() - start
        info = runner.info
        self.metrics.loaded(info, elapsed)
        self.metrics.serving(self.version)
        log.info(
            "ready: %s (%s, %d layers, hidden %d, vocab %d, aux layers %s, %s on %s, version %s) loaded and "
            "warmed in %.1fs",
            info.model,
            info.engine,
            info.num_hidden_layers,
            info.hidden_size,
            info.vocab_size,
            info.aux_layer_ids,
            info.dtype,
            info.device,
            self.version,
            elapsed,
        )
        return True

    def status(self) -> str:
        """ "ok", "loading" or "draining": what /health reports."""
        if self.draining:
            return "draining"
        return "loading" if self.runner is None else "ok"

    def ready(self) -> TargetRunner:
        """The runner, for a request; NotReady while loading or draining."""
        if self.draining:
            raise NotReady("draining", "this server is shutting down; use another")
        if self.runner is None:
            raise NotReady("not_ready", "the target model is still loading")
        return self.runner

    async def call(self, fn, *args):
        """``fn(*args)`` on the model thread."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def close(self) -> None:
        if self.runner is not None:
            await self.call(self.runner.close)
        self._thread.shutdown(wait=False)


def offered(runner: TargetRunner, encoding: str) -> str:
    """``encoding`` if the runner offers it; else InvalidInput naming the ones it does."""
    if encoding not in runner.info.encodings:
        raise InvalidInput(
            "encoding_not_offered",
            f"encoding {encoding!r} is not offered; this server offers {', '.join(runner.info.encodings)}",
        )
    return encoding


def _check_capabilities(runner: TargetRunner) -> None:
    if encodings.HIDDEN in runner.info.encodings and not isinstance(runner, HiddenStateRunner):
        raise TypeError(f"{type(runner).__name__} offers the hidden encoding but is no HiddenStateRunner")


def _warm_up(runner: TargetRunner) -> None:
    """One tiny forward and projection, so the first real request pays no lazy initialisation."""
    device = runner.info.device
    ids = torch.zeros(1, WARMUP_TOKENS, dtype=torch.long, device=device)
    logits, aux = runner.forward(ids, torch.ones_like(ids))
    build_supervision(logits, aux, ids, ids, VocabMapping.identity(logits.shape[-1], device))
