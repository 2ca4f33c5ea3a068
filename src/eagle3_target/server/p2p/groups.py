"""P2PGroups: one two-rank p2p group per client session.

/init_nccl reserves a port for the calling session, on the address the request
arrived at: a free port of this pod's range (pods sharing a node under
hostNetwork get disjoint ranges) or the port a NeMo client names, which must lie
in that range. Our client asks for the authenticated mode: the reply carries a
per-group secret and the group is only formed with a peer that proves it (see
protocol/rendezvous.py). A /generate that carries ``X-NeMo-NCCL: 1`` and finds its session's
group up is answered with JSON metadata and then the tensors over the group.

A port stays reserved until its group is torn down and released: on any
failure, a new /init_nccl of the session, a rendezvous nobody completes within
the rendezvous timeout, a session silent for the idle timeout, its end, a
cancelled transfer, or shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from eagle3_target.protocol import contract
from eagle3_target.protocol.p2p import NCCL, backend_for
from eagle3_target.protocol.rendezvous import PeerRejected, group_name, listen, new_secret

from ..errors import Forbidden, InvalidInput
from ..sessions import Session
from .group import SessionGroup, Transfer
from .options import P2POptions

log = logging.getLogger(__name__)


class P2PGroups:
    """Every session's group: /init_nccl, the transfer of a /generate, teardown."""

    def __init__(
        self,
        options: P2POptions,
        *,
        require_auth: bool = False,
        registry: CollectorRegistry | None = None,
    ):
        self.options = options
        self.ports = options.port_range
        self.require_auth = require_auth  # refuse NeMo's unauthenticated mode
        self.groups: dict[str, SessionGroup] = {}  # session id -> its group
        self.held: dict[int, SessionGroup] = {}  # port -> the group that has not released it yet
        self.active, self.ports_held, self.teardowns = _metrics(registry)

    def info(self, device: str) -> dict[str, Any]:
        """What model_info advertises (a NeMo client ignores it)."""
        if not self.options.enabled:
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
        if not self.options.enabled:
            log.info("session %r: /init_nccl refused: --disable-p2p", session.id)
            return {"status": "disabled"}
        backend = backend_for(device)
        if asked != backend:
            log.info(
                "session %r: /init_nccl refused: asked for %r, tensors on %s need %s",
                session.id,
                asked,
                device,
                backend,
            )
            return {"status": "disabled"}
        if self.require_auth and not authenticated:
            raise Forbidden(
                "p2p_auth_required",
                f'this server forms groups only with a proven peer: send "auth": "{contract.P2P_AUTH}" '
                "(NeMo's unauthenticated mode needs --allow-unauthenticated-p2p)",
            )
        if port is not None and (self.ports is None or port not in self.ports):
            raise InvalidInput("port_out_of_range", f"nccl_port {port} is outside this server's {self.ports}")
        self.teardown(session, "reinitialised")  # a second init means the client built a fresh group
        try:
            sg, reply = self.open(session, address, port, backend, device, authenticated)
        except OSError as exc:
            return {"status": "failed", "detail": str(exc)}
        if authenticated or not nemo_order:
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

    def open(
        self, session: Session, address: str, port: int | None, backend: str, device: str, authenticated: bool
    ) -> tuple[SessionGroup, dict[str, Any]]:
        """Reserve ``port`` (None: any free one of the range) for ``session`` and start its rendezvous; the
        reply tells the peer where to join (and, authenticated, the secret). OSError: no port."""
        sock = self._reserve(address, port)
        port = sock.getsockname()[1]
        secret = new_secret() if authenticated else None
        sg = SessionGroup(session, address, port, secret, functools.partial(self._released, port))
        self.groups[session.id] = self.held[port] = sg
        sg.start(sock, backend, self.options.rendezvous_timeout, device, self._rendezvous_failed)
        self._count()
        log.info(
            "session %r: %s group %s listening on %s:%d", session.id, backend, group_name(port), address, port
        )
        reply = {
            "status": "ok",
            "nccl_port": port,
            "backend": backend,
            "group_name": group_name(port),
            "host": address,
        }
        return sg, reply if secret is None else {**reply, "secret": secret}

    def _reserve(self, address: str, port: int | None):
        """A listening socket on ``port``, or on a free port of the range; OSError when none is free."""
        if len(self.held) >= len(self.ports or ()):
            raise OSError(f"all {len(self.ports or ())} rendezvous ports of this server are reserved")
        if port is not None:
            if port in self.held:
                raise OSError(f"port {port} is reserved for another session")
            return listen(address, port)
        order = sorted(self.ports, key=lambda p: p != self.options.port)  # NeMo's default port first
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
            log.warning("session %r: rejected the peer on port %d: %s", sg.session.id, sg.port, sg.failure)
            self.teardown(sg.session, "peer_rejected")
        else:
            log.warning("session %r: rendezvous failed: %s", sg.session.id, sg.failure)
            self.teardown(sg.session, "rendezvous_failed")

    def _released(self, port: int) -> None:
        self.held.pop(port, None)
        self._count()

    def _count(self) -> None:
        self.active.set(len(self.groups))
        self.ports_held.set(len(self.held))

    # -- /generate -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def transfer(self, session: Session, asked: bool, sequence: str | None):
        """Yield a Transfer when this request may be answered over the session's group, else None.

        ``asked``: the request carries X-NeMo-NCCL: 1; ``sequence``: its X-Eagle3-Seq, if any.
        Holds the session's transfer lock throughout, so sequence numbers follow request order.
        """
        sg = self.groups.get(session.id)
        if not asked or sg is None:
            yield None
            return
        seq = _parse_seq(sequence)
        async with sg.lock:
            group = await asyncio.shield(sg.ready)
            current = self.groups.get(session.id) is sg
            if not current or group is None or group.closed:
                if current:  # the peer never joined in time, or the group broke: of no further use
                    self.teardown(session, "rendezvous_failed")
                yield None
            elif seq is not None and seq != sg.next_seq:
                log.warning(
                    "session %r: client expects transfer %d, next is %d", session.id, seq, sg.next_seq
                )
                self.teardown(session, "sequence_mismatch")
                yield None
            else:
                yield Transfer(sg, group, seq, self.options.timeout, self.teardown)

    # -- teardown --------------------------------------------------------------------------

    def teardown(self, session: Session, reason: str) -> None:
        sg = self.groups.pop(session.id, None)
        if sg is None:
            return
        log.info("session %r: tearing down group %s (%s)", session.id, group_name(sg.port), reason)
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
        period = min(5.0, max(0.2, self.options.idle_timeout / 4))
        while True:
            await asyncio.sleep(period)
            silent_since = time.monotonic() - self.options.idle_timeout
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
        raise InvalidInput("bad_json", f"/init_nccl body must be a JSON object: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInput("bad_json", "/init_nccl body must be a JSON object")
    port = doc.get("nccl_port")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535):
        raise InvalidInput("bad_port", f"nccl_port must be an integer in 1-65535, got {port!r}")
    backend = doc.get("backend", NCCL)  # NeMo always builds NCCL groups and names no backend
    if not isinstance(backend, str):
        raise InvalidInput("bad_backend", f"backend must be a string, got {backend!r}")
    auth = doc.get("auth")
    if auth not in (None, contract.P2P_AUTH):
        raise InvalidInput("bad_auth", f'auth must be "{contract.P2P_AUTH}" or absent, got {auth!r}')
    return port, backend, auth is not None


def _parse_seq(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        seq = int(value)
    except ValueError:
        seq = -1
    if seq < 0:
        raise InvalidInput("bad_sequence", f"{contract.SEQUENCE_HEADER} must be a non-negative integer")
    return seq


def _metrics(registry: CollectorRegistry | None) -> tuple[Gauge, Gauge, Counter]:
    """The groups held, the rendezvous ports held, and teardowns by reason."""
    return (
        Gauge("eagle3_target_p2p_groups", "Point-to-point groups held for sessions", registry=registry),
        Gauge(
            "eagle3_target_p2p_ports_held",
            "Rendezvous ports reserved, pending or up or still being released",
            registry=registry,
        ),
        Counter(
            "eagle3_target_p2p_teardowns_total",
            "Point-to-point groups torn down, by reason",
            ["reason"],
            registry=registry,
        ),
    )
