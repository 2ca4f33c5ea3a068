"""The server's point-to-point data plane: one two-rank group per client session.

/init_nccl binds a store for the calling session, on the address the request
arrived at and on the client's port (NeMo) or a free port of this pod's range
(ours: pods sharing a node under hostNetwork get disjoint ranges). A /generate
that carries ``X-NeMo-NCCL: 1`` and finds its session's group up is answered
with JSON metadata and then the tensors over the group. Any failure tears that
session's group down and later requests of the session go over the wire until
the client initialises again. Blocking torch calls run on this module's threads,
never on the event loop, and every one of them has a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge

from eagle3_target.protocol import spec
from eagle3_target.protocol.transport import NCCL, PeerGroup, TransferError, backend_for, group_name, listen

from .requests import RequestError
from .sessions import Session

log = logging.getLogger(__name__)

RESOURCE = "p2p"  # key in Session.resources


@dataclass(frozen=True)
class PortRange:
    start: int
    end: int  # inclusive

    @classmethod
    def parse(cls, text: str) -> PortRange:
        first, sep, last = text.partition("-")
        try:
            ports = cls(int(first), int(last if sep else first))
        except ValueError:
            raise ValueError(f"port range must look like START-END, got {text!r}") from None
        if not 1 <= ports.start <= ports.end <= 65535:
            raise ValueError(f"port range {text!r} is not within 1-65535 with START <= END")
        return ports

    def __iter__(self):
        return iter(range(self.start, self.end + 1))

    def __len__(self) -> int:
        return self.end - self.start + 1

    def __str__(self) -> str:
        return f"{self.start}-{self.end}"


class SessionGroup:
    """A session's group: built in the background, then used by one transfer at a time."""

    def __init__(self, port: int, address: str, backend: str, build: asyncio.Future):
        self.port, self.address, self.backend = port, address, backend
        self.build = build  # resolves to the PeerGroup once the client has joined
        self.next_seq = 0
        self.lock = asyncio.Lock()  # one transfer at a time, in request order

    def close(self, executor: ThreadPoolExecutor) -> None:
        """Abort the group off the event loop, now or as soon as its rendezvous ends."""

        def abort(build: asyncio.Future) -> None:
            if not build.cancelled() and build.exception() is None:
                executor.submit(build.result().close)

        self.build.add_done_callback(abort)


class Transfer:
    """One /generate answered over the group: send() after the HTTP response is flushed."""

    def __init__(
        self, plane: DataPlane, session: Session, sg: SessionGroup, group: PeerGroup, seq: int | None
    ):
        self.plane, self.session, self.sg, self.group = plane, session, sg, group
        self.seq = seq  # the client's sequence number, None for a NeMo client (sends no header)

    def response_headers(self) -> dict[str, str]:
        headers = {spec.NCCL_HEADER: "1"}
        if self.seq is not None:
            headers[spec.SEQUENCE_HEADER] = str(self.seq)
        return headers

    async def send(self, tensors: Mapping[str, torch.Tensor | None]) -> int:
        """Send ``tensors`` in order; return the bytes sent. TransferError leaves the session on the wire."""
        loop = asyncio.get_running_loop()
        try:
            sent = await loop.run_in_executor(
                self.plane.executor, self.group.send, tensors, self.seq, self.plane.transfer_timeout
            )
        except Exception as exc:
            self.plane.teardown(self.session, "send_failed")
            if isinstance(exc, TransferError):
                raise
            raise TransferError(f"send on {self.group.name} failed: {exc!r}") from exc
        self.sg.next_seq += 1
        return sent


class DataPlane:
    def __init__(
        self,
        ports: PortRange | None,
        *,
        enabled: bool = True,
        preferred_port: int | None = None,
        rendezvous_timeout: float = 120.0,
        transfer_timeout: float = 120.0,
        registry: CollectorRegistry | None = None,
    ):
        self.ports = ports
        self.enabled = enabled
        self.preferred_port = preferred_port
        self.rendezvous_timeout = rendezvous_timeout
        self.transfer_timeout = transfer_timeout
        self.max_groups = len(ports) if ports else 64
        self.groups: dict[str, SessionGroup] = {}  # session id -> its group
        # Per group at most one rendezvous or transfer, plus aborts.
        self.executor = ThreadPoolExecutor(2 * self.max_groups + 2, thread_name_prefix="p2p")
        self.active = Gauge(
            "eagle3_target_p2p_groups", "Point-to-point groups held for sessions", registry=registry
        )
        self.teardowns = Counter(
            "eagle3_target_p2p_teardowns_total",
            "Point-to-point groups torn down, by reason",
            ["reason"],
            registry=registry,
        )

    def info(self, device: str) -> dict[str, Any]:
        """What model_info advertises (a NeMo client ignores it)."""
        if not self.enabled:
            return {"backend": None}
        return {
            "backend": backend_for(device),
            "port_range": [self.ports.start, self.ports.end] if self.ports else None,
        }

    # -- /init_nccl ------------------------------------------------------------------------

    async def init(self, session: Session, address: str, body: bytes, device: str) -> dict[str, Any]:
        """Handle /init_nccl for ``session``; ``address`` is the local address its request arrived at."""
        port, asked = _parse_init(body)
        named = port is not None
        # "disabled" stays NeMo's exact reply; the reason goes to our log.
        if not self.enabled:
            log.info("session %s: /init_nccl refused: --disable-p2p", session.id)
            return {"status": "disabled"}
        backend = backend_for(device)
        if asked != backend:
            log.info(
                "session %s: /init_nccl refused: asked for %s, tensors on %s need %s",
                session.id,
                asked,
                device,
                backend,
            )
            return {"status": "disabled"}
        self.teardown(session, "reinitialised")  # a second init means the client built a fresh transport
        if len(self.groups) >= self.max_groups:
            return {"status": "failed", "detail": f"this server already holds {self.max_groups} groups"}
        try:
            sock = listen(address, port) if port is not None else self._allocate(address)
        except OSError as exc:
            return {"status": "failed", "detail": f"cannot listen on {address}:{port or self.ports}: {exc}"}
        port = sock.getsockname()[1]
        loop = asyncio.get_running_loop()
        build = loop.run_in_executor(
            self.executor, PeerGroup.host, sock, backend, self.rendezvous_timeout, device
        )
        sg = self.groups[session.id] = SessionGroup(port, address, backend, build)
        session.resources[RESOURCE] = sg
        self.active.set(len(self.groups))
        build.add_done_callback(lambda f: self._built(session, sg, f))
        log.info(
            "session %s: %s group %s listening on %s:%d", session.id, backend, group_name(port), address, port
        )
        reply = {
            "status": "ok",
            "nccl_port": port,
            "backend": backend,
            "group_name": group_name(port),
            "host": address,
        }
        # NeMo's client joins while this request is open: answer once the rendezvous is over.
        if named and await self._ready(sg) is None:
            return {"status": "failed", "detail": f"rendezvous on {address}:{port} did not complete"}
        return reply

    def _allocate(self, address: str):
        if self.ports is None:
            raise OSError("no --nccl-port-range configured and the client named no port")
        taken = {sg.port for sg in self.groups.values()}
        order = sorted(self.ports, key=lambda p: p != self.preferred_port)  # NeMo's default port first
        for port in order:
            if port in taken:
                continue
            try:
                return listen(address, port)
            except OSError:
                continue  # another pod on this node holds it
        raise OSError(f"every port of {self.ports} is in use")

    def _built(self, session: Session, sg: SessionGroup, build: asyncio.Future) -> None:
        if build.cancelled():
            return
        if build.exception() is not None:
            log.warning("session %s: rendezvous failed: %s", session.id, build.exception())
            if self.groups.get(session.id) is sg:
                self.teardown(session, "rendezvous_failed")

    async def _ready(self, sg: SessionGroup) -> PeerGroup | None:
        try:  # the build is bounded by the rendezvous timeout itself; once it fails, its port is free
            group = await asyncio.shield(sg.build)
        except (TransferError, RuntimeError):
            return None
        return None if group.closed else group

    # -- /generate -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def transfer(self, session: Session, headers: Mapping[str, str]):
        """Yield a Transfer when this request may be answered over the session's group, else None.

        Holds the session's transfer lock throughout, so sequence numbers follow request order.
        """
        sg = self.groups.get(session.id)
        if headers.get(spec.NCCL_HEADER) != "1" or sg is None:
            yield None
            return
        seq = _parse_seq(headers.get(spec.SEQUENCE_HEADER))
        async with sg.lock:
            group = await self._ready(sg)
            if self.groups.get(session.id) is not sg:
                yield None
            elif group is None:  # the peer never joined in time: the group is of no further use
                self.teardown(session, "rendezvous_failed")
                yield None
            elif seq is not None and seq != sg.next_seq:
                log.warning(
                    "session %s: client expects transfer %d, next is %d", session.id, seq, sg.next_seq
                )
                self.teardown(session, "sequence_mismatch")
                yield None
            else:
                yield Transfer(self, session, sg, group, seq)

    # -- teardown --------------------------------------------------------------------------

    def teardown(self, session: Session, reason: str) -> None:
        sg = self.groups.pop(session.id, None)
        session.resources.pop(RESOURCE, None)
        if sg is None:
            return
        log.info("session %s: tearing down group %s (%s)", session.id, group_name(sg.port), reason)
        sg.close(self.executor)
        self.teardowns.labels(reason).inc()
        self.active.set(len(self.groups))

    def end_session(self, session: Session) -> None:
        """SessionTable.on_end hook: /disconnect, expiry or shutdown."""
        self.teardown(session, "session_ended")

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


def _parse_init(body: bytes) -> tuple[int | None, str]:
    """(port or None, backend asked for) from an /init_nccl body, parsed as JSON whatever its content type."""
    try:
        doc = json.loads(body or b"{}")
    except (ValueError, RecursionError) as exc:  # RecursionError: deeply nested arrays
        raise RequestError(400, "bad_json", f"/init_nccl body must be a JSON object: {exc}") from None
    if not isinstance(doc, dict):
        raise RequestError(400, "bad_json", "/init_nccl body must be a JSON object")
    port = doc.get("nccl_port")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535):
        raise RequestError(400, "bad_port", f"nccl_port must be an integer in 1-65535, got {port!r}")
    backend = doc.get("backend", NCCL)  # NeMo always builds NCCL groups and names no backend
    if not isinstance(backend, str):
        raise RequestError(400, "bad_backend", f"backend must be a string, got {backend!r}")
    return port, backend


def _parse_seq(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        seq = int(value)
    except ValueError:
        seq = -1
    if seq < 0:
        raise RequestError(400, "bad_sequence", f"{spec.SEQUENCE_HEADER} must be a non-negative integer")
    return seq
