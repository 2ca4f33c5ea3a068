"""The client's side of the p2p path to one server: its group, rebuilt after a failure.

Modes: "wire" never uses it; "auto" uses it when it is GPU-direct (the server
offers NCCL and this process has CUDA); "p2p" also takes gloo on CPU and fails
loudly when no group can be built (for benchmarks). A batch whose transfer
fails, times out or is out of sequence is fetched again over the wire; the
group is dropped and rebuilt after ``retry_after`` seconds. The HTTP half of a
p2p /generate is fetch.py's: this module never speaks HTTP itself.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import torch

from eagle3_target.protocol import contract, wire
from eagle3_target.protocol.choices import DATA_PATHS
from eagle3_target.protocol.metadata import decode_metadata
from eagle3_target.protocol.model_info import ModelInfo
from eagle3_target.protocol.p2p import GLOO, NCCL, PeerGroup, TransferError

from .connection import ServerError
from .errors import ServerFault

log = logging.getLogger(__name__)

InitNccl = Callable[[bytes], Awaitable[dict[str, Any]]]  # POST /init_nccl: body -> JSON reply


def _check_metadata(metadata: Mapping[str, Any], want: Mapping[str, tuple[Any, tuple[int, ...]]]) -> None:
    announced = {k: v for k, v in metadata.items() if v is not None}
    if set(announced) != set(want):
        raise ServerFault(f"p2p metadata announces {sorted(announced)[:8]}, expected {sorted(want)}")
    for key, (dtype, shape) in want.items():
        got_dtype, got_shape = announced[key]
        if tuple(got_shape) != tuple(shape) or (dtype is not None and got_dtype != dtype):
            raise ServerFault(
                f"p2p metadata: {key!r} is {got_dtype} {list(got_shape)[:8]}, expected {dtype or 'any'} {list(shape)}"
            )


class P2PUnavailable(RuntimeError):
    """--data-path p2p was asked for and this server cannot give it."""


def offered_backend(info: ModelInfo, mode: str) -> str:
    """The group backend to use with a server in ``mode``; P2PUnavailable says why there is none."""
    offered = info.p2p.get("backend")
    if mode == "wire":
        raise P2PUnavailable("the wire path was asked for")
    if offered not in (GLOO, NCCL):
        raise P2PUnavailable("the server offers no p2p path")
    if offered == NCCL and not torch.cuda.is_available():
        raise P2PUnavailable("the server offers NCCL and this process has no CUDA device")
    if offered == GLOO and mode == "auto":
        raise P2PUnavailable("the server offers gloo (CPU), which auto mode leaves to the wire")
    return offered


def wanted(info: ModelInfo, mode: str) -> bool:
    """Whether a server joining with ``info`` gets a channel: where it offers a usable group, and always
    in "p2p" mode (whose channel then fails loudly)."""
    try:
        offered_backend(info, mode)
    except P2PUnavailable:
        return mode == "p2p"
    return True


class P2PChannel:
    """One server's group, for the channel's lifetime. Hold ``lock`` across a request and its transfer."""

    def __init__(
        self,
        url: str,
        info: ModelInfo,
        mode: str = "auto",
        *,
        timeout: float = 120.0,
        retry_after: float = 60.0,
    ):
        if mode not in DATA_PATHS:
            raise ValueError(f"unknown data path {mode!r}; choose {', '.join(DATA_PATHS)}")
        self.url, self.info, self.mode, self.timeout, self.retry_after = url, info, mode, timeout, retry_after
        self.group: PeerGroup | None = None
        self.next_seq = 0
        self.retry_at = 0.0  # monotonic time before which we do not try to build a group
        self.transfers = self.fallbacks = 0
        self.lock = asyncio.Lock()  # one transfer at a time on the group, in sequence order

    def request_headers(self) -> dict[str, str]:
        """What a /generate adds to ask for the next transfer over the group."""
        return {contract.NCCL_HEADER: "1", contract.SEQUENCE_HEADER: str(self.next_seq)}

    async def receive(
        self, headers: Mapping[str, str], payload: bytes, want: Mapping[str, tuple[Any, tuple[int, ...]]]
    ) -> dict[str, torch.Tensor | None] | None:
        """The tensors a p2p reply (``headers`` and its metadata ``payload``) announces; None: fetch them
        over the wire instead (the group is then dropped). Metadata that differs from ``want`` (key ->
        (dtype or None, shape)) is a server fault, raised before any receive is posted: a receive sized
        from a lie can abort the process inside gloo."""
        seq = self.next_seq
        try:
            if headers.get(contract.SEQUENCE_HEADER) != str(seq):
                raise TransferError(
                    f"server echoed transfer {headers.get(contract.SEQUENCE_HEADER)}, not {seq}"
                )
            metadata = decode_metadata(payload)
            _check_metadata(metadata, want)
            loop = asyncio.get_running_loop()
            tensors = await loop.run_in_executor(None, self.group.recv, metadata, seq, self.timeout)
        except ServerFault as exc:
            self.reset(str(exc))  # the server posted sends we will never receive
            raise
        except (TransferError, wire.WireError) as exc:
            self.reset(str(exc))
            self.fallbacks += 1
            return None
        self.next_seq += 1
        self.transfers += 1
        return tensors

    async def ready(self, init_nccl: InitNccl) -> bool:
        """Whether a group is up, building one if it is time to; False: use the wire for this request."""
        if self.group is not None and not self.group.closed:
            return True
        if time.monotonic() < self.retry_at:
            return False
        try:
            self.group = await self._build(init_nccl)
        except (TransferError, P2PUnavailable) as exc:
            self.retry_at = time.monotonic() + self.retry_after
            if self.mode == "p2p":
                raise P2PUnavailable(f"{self.url}: no p2p group: {exc}") from exc
            log.info("%s: using the wire path: %s", self.url, exc)
            return False
        self.next_seq = 0
        log.info("%s: p2p %s group %s is up", self.url, self.group.backend, self.group.name)
        return True

    async def _build(self, init_nccl: InitNccl) -> PeerGroup:
        offered = offered_backend(self.info, self.mode)
        body = json.dumps({"backend": offered, "auth": contract.P2P_AUTH}).encode()
        try:
            reply = await init_nccl(body)
        except ServerError as exc:  # a dropped connection is the pool's to handle: it propagates
            raise P2PUnavailable(f"/{contract.INIT_NCCL} failed: {exc}") from exc
        if reply.get("status") != "ok" or "secret" not in reply:
            raise P2PUnavailable(f"/{contract.INIT_NCCL} answered {reply}")
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

    def close(self) -> None:
        """Drop the group for good: the agreement that held this channel has ended."""
        if self.group is not None:
            self.group.close()
            self.group = None

    def reset(self, why: str) -> None:
        """Drop the group (the server drops its side on its own failure or at our next /init_nccl)."""
        if self.group is not None:
            log.warning("dropping p2p group %s: %s", self.group.name, why)
            self.group.close()
            self.group = None
            self.retry_at = time.monotonic() + self.retry_after
