"""The client side of the point-to-point data path, one channel per server connection.

Modes: "wire" never uses it; "auto" uses it when it is GPU-direct (the server
offers NCCL and this process has CUDA); "p2p" also takes gloo on CPU and fails
loudly when no group can be built (for benchmarks). A batch whose transfer
fails, times out or is out of sequence is fetched again over the wire; the
group is dropped and rebuilt after ``retry_after`` seconds.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Mapping

import torch

from eagle3_target.protocol import contract, wire
from eagle3_target.protocol.choices import DATA_PATHS
from eagle3_target.protocol.metadata import decode_metadata
from eagle3_target.protocol.model_info import ModelInfo
from eagle3_target.protocol.transport import GLOO, NCCL, PeerGroup, TransferError

from .connection import ServerConnection, ServerError

log = logging.getLogger(__name__)
Answer = tuple[Mapping[str, str], dict[str, torch.Tensor | None]]  # reply headers, tensors


class P2PUnavailable(RuntimeError):
    """--data-path p2p was asked for and this server cannot give it."""


def offered_backend(info: ModelInfo, mode: str) -> str:
    """The group backend to use with a server in ``mode``; P2PUnavailable says why there is none."""
    offered = info.p2p.get("backend")
    if mode == "wire":
        raise P2PUnavailable("the wire path was asked for")
    if offered not in (GLOO, NCCL):
        raise P2PUnavailable("the server offers no point-to-point path")
    if offered == NCCL and not torch.cuda.is_available():
        raise P2PUnavailable("the server offers NCCL and this process has no CUDA device")
    if offered == GLOO and mode == "auto":
        raise P2PUnavailable("the server offers gloo (CPU), which auto mode leaves to the wire")
    return offered


class P2PChannel:
    def __init__(self, mode: str = "auto", *, timeout: float = 120.0, retry_after: float = 60.0):
        if mode not in DATA_PATHS:
            raise ValueError(f"unknown data path {mode!r}; choose {', '.join(DATA_PATHS)}")
        self.mode, self.timeout, self.retry_after = mode, timeout, retry_after
        self.group: PeerGroup | None = None
        self.next_seq = 0
        self.retry_at = 0.0  # monotonic time before which we do not try to build a group
        self.transfers = self.fallbacks = 0
        self._lock = asyncio.Lock()  # one transfer at a time on the group, in sequence order

    # -- the hook ServerConnection.generate calls -----------------------------------------

    async def generate(
        self, conn: ServerConnection, request: bytes, headers: dict[str, str]
    ) -> Answer | None:
        """The reply's headers and tensors for ``request``; None means "use the wire path" (the caller then does)."""
        async with self._lock:
            return await self._generate(conn, request, headers)

    async def _generate(
        self, conn: ServerConnection, request: bytes, headers: dict[str, str]
    ) -> Answer | None:
        group = await self._group(conn)
        if group is None:
            return None
        seq = self.next_seq
        headers = {**headers, contract.NCCL_HEADER: "1", contract.SEQUENCE_HEADER: str(seq)}
        try:
            response, payload = await conn.post(contract.GENERATE, request, headers=headers)
        except ServerError as exc:
            self.reset(f"/generate answered {exc.status}")  # our session (and its group) may be gone
            if exc.status == 409 and exc.error == "no_vocab_mapping":
                return None  # the wire path re-sends the mapping and repeats the request
            raise
        except Exception:
            self.reset("the /generate request failed")  # we cannot know whether the server started sending
            raise
        if response.headers.get(contract.NCCL_HEADER) != "1":
            self.reset("the server answered over the wire")
            return response.headers, wire.decode(payload)
        try:
            if response.headers.get(contract.SEQUENCE_HEADER) != str(seq):
                raise TransferError(
                    f"server echoed transfer {response.headers.get(contract.SEQUENCE_HEADER)}, not {seq}"
                )
            metadata = decode_metadata(payload)
            loop = asyncio.get_running_loop()
            tensors = await loop.run_in_executor(None, group.recv, metadata, seq, self.timeout)
        except (TransferError, wire.WireError) as exc:
            self.reset(str(exc))
            self.fallbacks += 1
            return None
        self.next_seq += 1
        self.transfers += 1
        return response.headers, tensors

    # -- group lifecycle -------------------------------------------------------------------

    async def _group(self, conn: ServerConnection) -> PeerGroup | None:
        if self.group is not None and not self.group.closed:
            return self.group
        if time.monotonic() < self.retry_at:
            return None
        try:
            self.group = await self._build(conn)
        except (TransferError, P2PUnavailable) as exc:
            self.retry_at = time.monotonic() + self.retry_after
            if self.mode == "p2p":
                raise P2PUnavailable(f"{conn.url}: no point-to-point group: {exc}") from exc
            log.info("%s: using the wire path: %s", conn.url, exc)
            return None
        self.next_seq = 0
        log.info("%s: point-to-point %s group %s is up", conn.url, self.group.backend, self.group.name)
        return self.group

    async def _build(self, conn: ServerConnection) -> PeerGroup:
        offered = offered_backend(conn.info, self.mode)
        body = json.dumps({"backend": offered, "auth": contract.P2P_AUTH}).encode()
        try:
            reply = await conn.post_json(contract.INIT_NCCL, body)
        except ServerError as exc:
            raise P2PUnavailable(str(exc)) from exc
        if reply.get("status") != "ok" or "secret" not in reply:
            raise P2PUnavailable(f"/init_nccl answered {reply}")
        device = f"cuda:{torch.cuda.current_device()}" if offered == NCCL else "cpu"
        join = functools.partial(
            PeerGroup.join,
            reply["host"],
            int(reply["nccl_port"]),
            offered,
            self.timeout,
            device,
            secret=reply["secret"],
        )
        return await asyncio.get_running_loop().run_in_executor(None, join)

    def reset(self, why: str) -> None:
        """Drop the group (the server drops its side on its own failure or at our next /init_nccl)."""
        if self.group is not None:
            log.warning("dropping point-to-point group %s: %s", self.group.name, why)
            self.group.close()
            self.group = None
            self.retry_at = time.monotonic() + self.retry_after
