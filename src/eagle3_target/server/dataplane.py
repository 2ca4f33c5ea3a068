"""The server's point-to-point data plane: one two-rank group per client session.

/init_nccl reserves a port for the calling session, on the address the request
arrived at: a free port of this pod's range (pods sharing a node under
hostNetwork get disjoint ranges) or the port a NeMo client names, which must lie
in that range. Our client asks for the authenticated mode: the reply carries a
per-group secret and the group is only formed with a peer that proves it (see
transport). A /generate that carries ``X-NeMo-NCCL: 1`` and finds its session's
group up is answered with JSON metadata and then the tensors over the group.

A port stays reserved until its group is torn down and released: on any
failure, a new /init_nccl of the session, a rendezvous nobody completes within
the rendezvous timeout, a session silent for the idle timeout, its end, a
cancelled transfer, or shutdown. Blocking torch calls run on daemon threads,
never on the event loop, each with a deadline, and never hold up the process's
exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge

from eagle3_target.protocol import contract
from eagle3_target.protocol.p2p import NCCL, PeerGroup, backend_for
from eagle3_target.protocol.rendezvous import (
    PeerRejected,
    TransferError,
    group_name,
    hang_up,
    listen,
    new_secret,
)

from .request import RequestError
from .sessions import Session

log = logging.getLogger(__name__)


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

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.start <= port <= self.end

    def __len__(self) -> int:
        return self.end - self.start + 1

    def __str__(self) -> str:
        return f"{self.start}-{self.end}"


def _off_loop(fn: Callable, *args, name: str) -> asyncio.Future:
    """Run a blocking torch call on a daemon thread: never on the event loop, never holding up exit."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result, error) -> None:
        if not future.done():
            future.set_result(result) if error is None else future.set_exception(error)

    def run() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as exc:  # handed to the awaiting task
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: the process is exiting
            loop.call_soon_threadsafe(settle, result, error)
        del result, error  # else this frame and the exception's traceback form a cycle

    threading.Thread(target=run, daemon=True, name=name).start()
    return future


def _close_and_drain(group: PeerGroup) -> None:
    group.close()
    group.drained()


class SessionGroup:
    """A session's group, from /init_nccl until its port is free again."""

    def __init__(
        self, session: Session, address: str, port: int, secret: str | None, on_released: Callable[[], None]
    ):
        self.session, self.address, self.port, self.secret = session, address, port, secret
        self.ready = asyncio.get_running_loop().create_future()  # the PeerGroup, or None if it never will be
        self.failure: TransferError | None = None
        self.next_seq = 0
        self.lock = asyncio.Lock()  # one transfer at a time, in request order
        self._cancel = threading.Event()  # tells a pending rendezvous to give up
        self._on_released = on_released
        self._ended = False

    def start(self, sock, backend: str, timeout: float, device: str, on_failed: Callable) -> None:
        host = functools.partial(
            PeerGroup.host, sock, backend, timeout, device, secret=self.secret, cancelled=self._cancel
        )
        build = _off_loop(host, name=f"p2p rendezvous {self.port}")
        build.add_done_callback(lambda done: self._built(done, on_failed))

    def _built(self, build: asyncio.Future, on_failed: Callable) -> None:
        group = None if build.exception() is not None else build.result()
        if self._ended:  # torn down while the rendezvous ran
            self._release(group)
        elif group is None:
            self.failure = build.exception()
            self.ready.set_result(None)
            on_failed(self)
        else:
            self.ready.set_result(group)

    def end(self) -> None:
        """Cancel a pending rendezvous or abort the group; the port is released once that is done."""
        if self._ended:
            return
        self._ended = True
        self._cancel.set()
        if not self.ready.done():
            self.ready.set_result(None)  # waiters stop waiting; _built releases when the rendezvous returns
            # torch may be blocked on the store; breaking its connections makes it return now.
            _off_loop(hang_up, self.address, self.port, name=f"p2p hang up {self.port}")
        else:
            self._release(self.ready.result())

    def _release(self, group: PeerGroup | None) -> None:
        if group is None:
            self._on_released()
        else:
            abort = _off_loop(_close_and_drain, group, name=f"p2p abort {self.port}")
            abort.add_done_callback(lambda _: self._on_released())


class Transfer:
    """One /generate answered over the group: send() after the HTTP response is flushed."""

    def __init__(
        self, plane: DataPlane, session: Session, sg: SessionGroup, group: PeerGroup, seq: int | None
    ):
        self.plane, self.session, self.sg, self.group = plane, session, sg, group
        self.seq = seq  # the client's sequence number, None for a NeMo client (sends no header)

    def response_headers(self) -> dict[str, str]:
        headers = {contract.NCCL_HEADER: "1"}
        if self.seq is not None:
            headers[contract.SEQUENCE_HEADER] = str(self.seq)
        return headers

    async def send(self, tensors: Mapping[str, torch.Tensor | None]) -> int:
        """Send ``tensors`` in order; return the bytes sent. TransferError leaves the session on the wire."""
        send = functools.partial(self.group.send, tensors, self.seq, self.plane.transfer_timeout)
        try:
            sent = await _off_loop(send, name=f"p2p send {self.sg.port}")
        except BaseException as exc:  # a cancelled send leaves the group mid-transfer: it goes too
            cancelled = isinstance(exc, asyncio.CancelledError)
            self.plane.teardown(self.session, "cancelled" if cancelled else "send_failed")
            if isinstance(exc, TransferError) or not isinstance(exc, Exception):
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
        require_auth: bool = False,
        rendezvous_timeout: float = 30.0,
        transfer_timeout: float = 120.0,
        idle_timeout: float = 45.0,
        registry: CollectorRegistry | None = None,
    ):
        self.ports = ports
        self.enabled = enabled
        self.preferred_port = preferred_port
        self.require_auth = require_auth  # refuse NeMo's unauthenticated mode
        self.rendezvous_timeout = rendezvous_timeout
        self.transfer_timeout = transfer_timeout
        self.idle_timeout = idle_timeout  # a heartbeating session silent this long loses its group
        self.groups: dict[str, SessionGroup] = {}  # session id -> its group
        self.held: dict[int, SessionGroup] = {}  # port -> the group that has not released it yet
        self.active = Gauge(
            "eagle3_target_p2p_groups", "Point-to-point groups held for sessions", registry=registry
        )
        self.ports_held = Gauge(
            "eagle3_target_p2p_ports_held",
            "Rendezvous ports reserved, pending or up or still being released",
            registry=registry,
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
        port, asked, authenticated = _parse_init(body)
        nemo_order = port is not None and not authenticated  # NeMo joins while this request is open
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
        if self.require_auth and not authenticated:
            raise RequestError(
                403,
                "p2p_auth_required",
                f'this server forms groups only with a proven peer: send "auth": "{contract.P2P_AUTH}" '
                "(NeMo's unauthenticated mode needs --allow-unauthenticated-p2p)",
            )
        if port is not None and (self.ports is None or port not in self.ports):
            raise RequestError(
                400, "port_out_of_range", f"nccl_port {port} is outside this server's {self.ports}"
            )
        self.teardown(session, "reinitialised")  # a second init means the client built a fresh transport
        try:
            sock = self._reserve(address, port)
        except OSError as exc:
            return {"status": "failed", "detail": str(exc)}
        port = sock.getsockname()[1]
        secret = new_secret() if authenticated else None
        sg = SessionGroup(session, address, port, secret, functools.partial(self._released, port))
        self.groups[session.id] = self.held[port] = sg
        sg.start(sock, backend, self.rendezvous_timeout, device, self._rendezvous_failed)
        self._count()
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
        if secret is not None:
            return {**reply, "secret": secret}
        if not nemo_order:
            return reply
        try:  # answer once the rendezvous is over
            group = await asyncio.shield(sg.ready)
        except asyncio.CancelledError:
            if self.groups.get(session.id) is sg:
                self.teardown(session, "cancelled")
            raise
        if group is None:
            return {"status": "failed", "detail": f"rendezvous on {address}:{port} did not complete"}
        return reply

    def _reserve(self, address: str, port: int | None):
        """A listening socket on ``port``, or on a free port of the range; OSError when none is free."""
        if len(self.held) >= len(self.ports or ()):
            raise OSError(f"all {len(self.ports or ())} rendezvous ports of this server are reserved")
        if port is not None:
            if port in self.held:
                raise OSError(f"port {port} is reserved for another session")
            return listen(address, port)
        order = sorted(self.ports, key=lambda p: p != self.preferred_port)  # NeMo's default port first
        for candidate in order:
            if candidate in self.held:
                continue
            with contextlib.suppress(OSError):  # another pod on this node holds it
                return listen(address, candidate)
        raise OSError(f"every port of {self.ports} is in use")

    def _rendezvous_failed(self, sg: SessionGroup) -> None:
        if self.groups.get(sg.session.id) is not sg:
            return
        if isinstance(sg.failure, PeerRejected):
            log.warning("session %s: rejected the peer on port %d: %s", sg.session.id, sg.port, sg.failure)
            self.teardown(sg.session, "peer_rejected")
        else:
            log.warning("session %s: rendezvous failed: %s", sg.session.id, sg.failure)
            self.teardown(sg.session, "rendezvous_failed")

    def _released(self, port: int) -> None:
        self.held.pop(port, None)
        self._count()

    def _count(self) -> None:
        self.active.set(len(self.groups))
        self.ports_held.set(len(self.held))

    # -- /generate -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def transfer(self, session: Session, headers: Mapping[str, str]):
        """Yield a Transfer when this request may be answered over the session's group, else None.

        Holds the session's transfer lock throughout, so sequence numbers follow request order.
        """
        sg = self.groups.get(session.id)
        if headers.get(contract.NCCL_HEADER) != "1" or sg is None:
            yield None
            return
        seq = _parse_seq(headers.get(contract.SEQUENCE_HEADER))
        async with sg.lock:
            group = await asyncio.shield(sg.ready)
            current = self.groups.get(session.id) is sg
            if not current or group is None or group.closed:
                if current:  # the peer never joined in time, or the group broke: of no further use
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
        if sg is None:
            return
        log.info("session %s: tearing down group %s (%s)", session.id, group_name(sg.port), reason)
        sg.end()
        self.teardowns.labels(reason).inc()
        self._count()

    def end_session(self, session: Session) -> None:
        """SessionTable.on_end hook: /disconnect, expiry or shutdown."""
        self.teardown(session, "session_ended")

    async def watch(self) -> None:
        """Tear down the groups of authenticated sessions (ours heartbeat) silent for the idle timeout.

        NeMo's client never heartbeats, so its group lasts until a failure or its session ends.
        """
        period = min(5.0, max(0.2, self.idle_timeout / 4))
        while True:
            await asyncio.sleep(period)
            silent_since = time.monotonic() - self.idle_timeout
            for sg in list(self.groups.values()):
                if sg.secret is not None and not sg.lock.locked() and sg.session.last_seen < silent_since:
                    self.teardown(sg.session, "peer_silent")

    async def close(self, grace: float = 5.0) -> None:
        """Shutdown: tear every group down now, pending rendezvous included; wait up to ``grace``
        seconds for their threads to leave torch (one still inside it at exit aborts the process)."""
        for sg in list(self.groups.values()):
            self.teardown(sg.session, "shutdown")
        deadline = time.monotonic() + grace
        while self.held and time.monotonic() < deadline:
            await asyncio.sleep(0.05)


def _parse_init(body: bytes) -> tuple[int | None, str, bool]:
    """(port or None, backend asked for, authenticated mode) from an /init_nccl body, parsed as JSON."""
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
    auth = doc.get("auth")
    if auth not in (None, contract.P2P_AUTH):
        raise RequestError(400, "bad_auth", f'auth must be "{contract.P2P_AUTH}" or absent, got {auth!r}')
    return port, backend, auth is not None


def _parse_seq(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        seq = int(value)
    except ValueError:
        seq = -1
    if seq < 0:
        raise RequestError(400, "bad_sequence", f"{contract.SEQUENCE_HEADER} must be a non-negative integer")
    return seq
