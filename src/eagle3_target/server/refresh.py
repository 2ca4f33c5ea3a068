"""POST /weights/refresh: new target weights served in place, for the holder of the admin token.

The new weights are read and checked off the model thread while the old ones keep serving
(weight_source.py); then one call on the model thread, between two forwards, copies them into the served
tensors and sets the version. A forward runs wholly before or wholly after that call, so every reply comes
from one set of weights and names it (pipeline.py reads the version in the forward's own call). Anything
wrong is refused before that call: the old weights and their version keep serving. A split replica does the
same on every rank (runners/rank_refresh.py): each reads and checks its own part while the old weights serve,
and only when every rank has its part does one call swap them on every rank. No HTTP here.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Mapping

from eagle3_target.protocol.model_info import check_target_version

from .errors import Forbidden, InvalidInput, ServiceError, TooLarge, Unauthorized
from .metrics import ServerMetrics
from .model_host import ModelHost
from .weight_source import read_source

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 << 10
MAX_SOURCE_CHARS = 4096


def parse_request(body: bytes) -> tuple[str, str]:
    """(source, version) of a refresh body ``{"source": ..., "version": ...}``."""
    if len(body) > MAX_BODY_BYTES:
        raise TooLarge("request_entity_too_large", f"/weights/refresh takes at most {MAX_BODY_BYTES} bytes")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict) or set(doc) != {"source", "version"}:
        raise InvalidInput(
            "invalid_refresh", 'the body must be {"source": <folder or s3://...>, "version": <label>}'
        )
    source = doc["source"]
    if not isinstance(source, str) or not 0 < len(source) <= MAX_SOURCE_CHARS:
        raise InvalidInput(
            "invalid_refresh", f"source must be a path or s3:// URI of 1 to {MAX_SOURCE_CHARS} characters"
        )
    try:
        return source, check_target_version(doc["version"])
    except ValueError as exc:
        raise InvalidInput("invalid_version", str(exc)) from None


class WeightRefresh:
    """One refresh at a time, from a source (here) or a trainer's broadcast (refresh_broadcast.py); others wait
    their turn on ``lock`` (a fleet-wide rollout sends one per replica)."""

    def __init__(self, model: ModelHost, metrics: ServerMetrics, admin_token: str | None):
        self.model, self.metrics, self.admin_token = model, metrics, admin_token
        self.lock = asyncio.Lock()

    def authorize(self, authorization: str) -> None:
        """Forbidden without --admin-token-file, Unauthorized without its token (the trainers' is not enough)."""
        if self.admin_token is None:
            raise Forbidden(
                "refresh_disabled",
                "this server was started without --admin-token-file: it refreshes no weights",
            )
        given = authorization.encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, f"Bearer {self.admin_token}".encode()):
            raise Unauthorized("unauthorized", "/weights/refresh needs 'Authorization: Bearer <admin token>'")

    async def refresh(self, headers: Mapping[str, str], body: bytes) -> str:
        """The new version, once its weights serve (``headers``: the request's, for its Authorization)."""
        self.authorize(headers.get("Authorization", ""))
        source, version = parse_request(body)
        async with self.lock:
            start = time.perf_counter()
            try:
                runner = self.offered()
                staged = await self._stage(runner, source)
            except ServiceError as exc:
                self.refused(version, source, exc)
                raise
            await self.swap(runner, staged, version, source, start)
            del staged
        return version

    def offered(self):
        """The runner, where its engine can refresh in place; InvalidInput otherwise."""
        runner = self.model.ready()
        if not hasattr(runner, "replace_weights"):
            split = " split over ranks" if runner.info.parallel else ""
            raise InvalidInput(
                "refresh_not_offered",
                f"the {runner.info.engine} engine{split} cannot refresh its weights in place",
            )
        return runner

    async def served(self) -> tuple:
        """(runner, what a new set of weights must match) for a replica whose weights live whole in one
        process: the weights held here, or their layout (an engine that holds them in its own workers: vllm)."""
        runner = self.offered()
        if hasattr(runner, "begin_staging"):
            raise InvalidInput(
                "refresh_not_offered", "a replica split over ranks refreshes from a checkpoint only"
            )
        return runner, await self.layout(runner)

    async def layout(self, runner) -> Mapping:
        """What a new set of weights must match: the weights ``runner`` holds, or their layout."""
        return await self.model.call(getattr(runner, "served_layout", None) or runner.named_weights)

    def refused(self, version: str, source: str, exc: ServiceError) -> None:
        self.metrics.refreshes.labels("refused").inc()
        log.warning("refresh to %s from %s refused: %s", version, source, exc.detail)

    async def swap(self, runner, staged, version: str, source: str, start: float) -> None:
        """``staged`` (checked) and ``version`` served together, in one call on the model thread between two
        forwards; counted and logged with the seconds since ``start``."""
        await self.model.call(self._swap, runner, staged, version)
        elapsed = time.perf_counter() - start
        self.metrics.refreshes.labels("served").inc()
        self.metrics.refresh_seconds.set(elapsed)
        log.info("serving version %s from %s, refreshed in %.2fs", version, source, elapsed)

    async def _stage(self, runner, source: str):
        """The new weights read and checked, off the model thread; for a split replica (``begin_staging``),
        every rank's own part, held by the ranks until the swap (or dropped, when any rank refuses)."""
        if hasattr(runner, "begin_staging"):
            ticket = await self.model.call(runner.begin_staging, source)
            try:
                await asyncio.to_thread(runner.wait_staged, ticket)
            except BaseException:
                await self.model.call(runner.drop_staged, ticket)
                raise
            return ticket
        served = await self.layout(runner)
        return await asyncio.to_thread(read_source, source, served, runner.info.config_digest)

    def _swap(self, runner, staged, version: str) -> None:
        runner.replace_weights(staged)
        self.model.version, self.model.refreshed_at = version, time.time()
        self.metrics.serving(version)
