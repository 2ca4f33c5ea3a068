"""What a client asks of its session before and beside training: heartbeat, disconnect, model info, its
vocab mapping and its p2p group. No HTTP here (the service's contract in pyproject.toml)."""

from __future__ import annotations

import asyncio
import logging
import time

import torch

from eagle3_target.protocol import binding, contract
from eagle3_target.protocol.model_info import ModelInfo
from eagle3_target.protocol.supervision import VocabMapping

from .errors import TooLarge
from .metrics import ServerMetrics
from .model_host import ModelHost
from .options import ServerOptions
from .p2p.groups import P2PGroups
from .request import parse_vocab_mapping
from .sessions import PEER_PREFIX, SessionTable

log = logging.getLogger(__name__)

INIT_P2P_MAX_BYTES = 64 << 10  # a small JSON object, parsed on the event loop


class SessionEndpoints:
    """/heartbeat, /disconnect, /model_info, /set_vocab_mapping and /init_nccl, each named by session id."""

    def __init__(
        self,
        model: ModelHost,
        sessions: SessionTable,
        p2p: P2PGroups,
        options: ServerOptions,
        metrics: ServerMetrics,
        stopped: asyncio.Event,
    ):
        self.model, self.sessions, self.p2p = model, sessions, p2p
        self.options, self.metrics, self.stopped = options, metrics, stopped

    def heartbeat(self, session_id: str) -> None:
        self.sessions.touch(session_id)
        self.metrics.heartbeat_timestamp.set(time.time())

    def disconnect(self, session_id: str) -> None:
        if self.sessions.end(session_id):
            log.info("session %r disconnected", session_id)
        if self.options.exit_on_disconnect:
            log.info("--exit-on-disconnect: stopping after this response")
            asyncio.get_running_loop().call_soon(self.stopped.set)

    def model_info(self, session_id: str) -> ModelInfo:
        runner = self.model.ready()
        self.sessions.touch(session_id)
        return runner.info.model_info(
            nccl_port=self.options.p2p.port,
            p2p=self.p2p.info(runner.info.device),
            request_binding=binding.SCHEME,
            target_version=self.model.version,
            refreshed_at=self.model.refreshed_at,
        )

    async def set_vocab_mapping(self, session_id: str, body: bytearray) -> None:
        runner = self.model.ready()
        session = self.sessions.touch(session_id)
        # Off the event loop: validating a 64 MiB body must not stall /livez and /health.
        vocab = await asyncio.to_thread(parse_vocab_mapping, body, runner.info.vocab_size, runner.info.device)
        if (
            session.id.startswith(PEER_PREFIX)
            and session.vocab is not None
            and not _same(session.vocab, vocab)
        ):
            # Header-less (NeMo) trainers on one node share this session: the last mapping wins for all.
            log.warning(
                "session %r: a different vocab mapping replaces the current one; trainers sharing an "
                "address should each send %s",
                session.id,
                contract.SESSION_HEADER,
            )
            self.metrics.peer_mapping_conflicts.inc()
        session.vocab = vocab  # a forward already running keeps the mapping it was handed

    async def init_p2p(self, session_id: str, address: str, body: bytes) -> dict:
        """/init_nccl: reserve a port on ``address`` (where the request arrived) for the session's group."""
        runner = self.model.ready()
        session = self.sessions.touch(session_id)
        if len(body) > INIT_P2P_MAX_BYTES:
            raise TooLarge("request_entity_too_large", f"/init_nccl takes at most {INIT_P2P_MAX_BYTES} bytes")
        return await self.p2p.init(session, address, body, runner.info.device)


def _same(a: VocabMapping, b: VocabMapping) -> bool:
    return torch.equal(a.selected_token_ids, b.selected_token_ids) and torch.equal(
        a.selected_token_mask, b.selected_token_mask
    )
