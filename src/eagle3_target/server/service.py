"""The target service: what each endpoint asks of the model, with no HTTP in it, in five parts.

- lifetime (here and model_host.py): load and warm the runner in the background, expire sessions, watch
  the p2p groups, drain, stop, release;
- sessions and vocabulary (session_endpoints.py): heartbeat, disconnect, model info, vocab mappings, p2p;
- weights (weight_endpoints.py): input embeddings, lm_head rows, whole weights; new ones in place
  (refresh.py; sent live by a trainer over p2p: refresh_broadcast.py);
- the generate/capture pipeline (pipeline.py): /generate into supervision or a feature request's reply;
- speculative decoding (speculative/): a draft's acceptance, its steps in the same turns at the model;
- text generation (generation.py) for the OpenAI-compatible endpoints, through the same scheduler.

Requests name their session by id; failures are ServiceErrors (errors.py) that the HTTP layer maps to
status codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from .generation import GenerationService
from .metrics import ServerMetrics
from .model_host import ModelHost
from .options import ServerOptions
from .p2p.groups import P2PGroups
from .pipeline import GeneratePipeline
from .refresh import WeightRefresh
from .refresh_broadcast import WeightBroadcast
from .runners import TargetRunner
from .session_endpoints import SessionEndpoints
from .sessions import SessionTable
from .speculative.evaluate import SpeculativeEvaluator
from .weight_endpoints import WeightEndpoints

log = logging.getLogger(__name__)


class TargetService:
    """One server's model, sessions and p2p groups, and the endpoint families over them."""

    def __init__(self, loader: Callable[[], TargetRunner], options: ServerOptions, metrics: ServerMetrics):
        self.options, self.metrics = options, metrics
        self.model = ModelHost(loader, metrics)
        self.stopped = asyncio.Event()  # set by --exit-on-disconnect or a failed load
        self.sessions = SessionTable(
            options.session_ttl, max_sessions=options.max_sessions, gauge=metrics.sessions
        )
        self.p2p = P2PGroups(options.p2p, require_auth=options.p2p_requires_auth, registry=metrics.registry)
        self.sessions.on_end(self.p2p.end_session)
        self.clients = SessionEndpoints(self.model, self.sessions, self.p2p, options, metrics, self.stopped)
        self.weights = WeightEndpoints(self.model, self.sessions)
        self.refresh = WeightRefresh(self.model, metrics, options.admin_token)
        self.broadcast = WeightBroadcast(self.refresh, self.p2p)
        self.pipeline = GeneratePipeline(self.model, self.sessions, self.p2p, options, metrics)
        self.speculative = SpeculativeEvaluator(self.model, self.pipeline.turns, options, metrics)
        self.generation = GenerationService(
            self.model,
            self.pipeline.turns,
            options.generation,
            options.max_batch_tokens,
            options.max_priority,
            metrics,
        )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Load the model in the background, expire sessions, watch p2p groups; on exit, release it all."""
        tasks = [
            asyncio.create_task(self._load()),
            asyncio.create_task(self._expire_sessions()),
            asyncio.create_task(self.p2p.watch()),
        ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.sessions.end_all()
            await self.p2p.close()
            await self.model.close()

    def drain(self) -> None:
        """SIGTERM: finish what is in flight, take nothing new (/health and model requests answer 503)."""
        self.model.draining = True

    async def _load(self) -> None:
        if not await self.model.load():
            self.stopped.set()

    async def _expire_sessions(self) -> None:
        ttl = self.options.session_ttl
        period = max(1.0, min(60.0, ttl / 4)) if ttl > 0 else 60.0
        while True:
            await asyncio.sleep(period)
            for sid in self.sessions.expire():
                log.info("session %r expired after %.0fs idle", sid, ttl)
