"""The pool of target servers: its connections, its lifetime, and the calls a trainer makes of it, each run
on one healthy server with failover and hedging (failover.py). Membership (membership.py) decides who is
healthy.
"""

from __future__ import annotations

import dataclasses

import aiohttp
import torch

from eagle3_target.protocol import encodings
from eagle3_target.protocol.model_info import ModelInfo

from .connection import ServerConnection
from .endpoints import EndpointResolver
from .failover import Failover
from .fetch import (
    Reply,
    fetch_capture,
    fetch_input_embeddings,
    fetch_lm_head,
    fetch_supervision,
    fetch_weight,
)
from .head_rows import HeadRowsCache
from .limits import new_session
from .members import Member
from .membership import Membership
from .options import PoolOptions


class TargetPool(Failover):
    """The servers behind one spec, under one session id: generate, capture, weights, the vocab mapping."""

    def __init__(
        self,
        resolver: EndpointResolver,
        session_id: str,
        *,
        auth_token: str | None = None,
        options: PoolOptions | None = None,
    ):
        self.session_id, self.auth_token = session_id, auth_token
        self.options = options or PoolOptions()
        super().__init__(Membership(resolver, self._connection, self.options), self.options)
        self._head_rows = HeadRowsCache()
        self._http: aiohttp.ClientSession | None = None

    def _connection(self, url: str, timeout: float | None = None) -> ServerConnection:
        assert self._http is not None
        limit = self.options.request_timeout if timeout is None else timeout
        return ServerConnection(
            url,
            self._http,
            self.session_id,
            auth_token=self.auth_token,
            timeout=limit,
            priority=self.options.priority,
        )

    # -- lifecycle and views --------------------------------------------------------------

    async def start(self) -> None:
        """Find the servers and return once one is ready (see Membership.start)."""
        self._http = new_session(connector=aiohttp.TCPConnector(limit=0))
        await self.membership.start()

    async def settle(self, timeout: float) -> int:
        """Wait (at most ``timeout``) until no server is still joining; return how many are healthy.
        start() returns as soon as one server is ready; a benchmark or probe wants the whole fleet."""
        return await self.membership.settle(timeout)

    async def close(self) -> None:
        await self.membership.close()
        if self._http is not None:
            await self._http.close()

    @property
    def reference(self) -> ModelInfo | None:
        """The model every member matches; None until one server has answered."""
        return self.membership.model.reference

    # -- the calls callers make ------------------------------------------------------------

    async def generate(self, request: bytes, batch: int, seq: int, draft_vocab: int) -> Reply:
        shape = (batch, seq, draft_vocab)
        return await self.with_failover(
            lambda m: self._supervise(m, request, shape), what="/generate", hedge=True
        )

    async def capture(self, request: bytes, batch: int, seq: int, draft_vocab: int) -> Reply:
        """The options' feature request: as NeMo's /generate where it is a server's supervision (Agreement)."""

        async def call(member: Member) -> Reply:
            agreement, shape = member.agreement, (batch, seq, draft_vocab)
            if agreement.supervised:
                return await self._supervise(member, request, shape)
            blob = self.membership.vocab_blob
            reply = await fetch_capture(member.conn, agreement, request, shape, blob, agreement.features)
            await self.membership.check_version(member, reply.target_version)
            return reply

        return await self.with_failover(call, what="/generate", hedge=True)

    async def _supervise(self, member: Member, request: bytes, shape: tuple[int, int, int]) -> Reply:
        agreement, blob = member.agreement, self.membership.vocab_blob
        reply = await fetch_supervision(member.conn, agreement, request, shape, blob)
        version = reply.target_version
        await self.membership.check_version(member, version)
        if reply.encoding == encodings.HIDDEN:
            fetch = lambda: fetch_lm_head(member.conn, agreement, shape[2], version)  # noqa: E731
            rows = await self._head_rows.get((blob, version), fetch)
            reply = dataclasses.replace(reply, head_rows=rows)
        return reply

    async def weight(self, name: str) -> torch.Tensor:
        return await self.with_failover(
            lambda m: fetch_weight(m.conn, m.agreement, name), what=f"/weights/{name}"
        )

    async def input_embeddings(self) -> torch.Tensor:
        return await self.with_failover(
            lambda m: fetch_input_embeddings(m.conn, m.agreement), what="/input_embeddings"
        )

    async def pin_version(self, version: str) -> None:
        self.membership.pin(version)

    async def set_vocab_mapping(self, blob: bytes) -> None:
        await self.membership.set_vocab_mapping(blob)
