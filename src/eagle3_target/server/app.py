"""The aiohttp target server: NeMo's eight endpoints plus liveness, readiness and metrics.

Flow of /generate: read and validate the body, take the compute lock, run the
forward and the supervision projection on the model thread, release the lock,
then stream the wire blob straight from tensor storage.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import resource
import signal
import socket
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NoReturn

import torch
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from eagle3_target.protocol import contract, encodings, metadata
from eagle3_target.protocol.rendezvous import TransferError
from eagle3_target.protocol.supervision import VocabMapping, build_supervision
from eagle3_target.protocol.wire import EncodedBlob

from .dataplane import DataPlane, PortRange
from .metrics import ServerMetrics
from .request import RequestError, parse_generate, parse_vocab_mapping
from .runners import TargetRunner
from .sessions import DEFAULT_MAX_SESSIONS, PEER_PREFIX, Session, SessionLimit, SessionTable, session_id

log = logging.getLogger(__name__)

# B=8, S=32768 is 6 MiB of /generate request; leave room for a 1M-token vocab mapping too.
DEFAULT_MAX_BODY_BYTES = 64 << 20
# B x S per /generate: the embedded model's CPU forward at 8192 tokens peaks near 0.5 GB and a few
# seconds (attention is quadratic in S); a GPU target with memory to spare raises it.
DEFAULT_MAX_BATCH_TOKENS = 8192
INIT_NCCL_MAX_BYTES = 64 << 10  # a small JSON object
# SIGTERM to exit: fits Kubernetes' default 30 s grace with room for the endpoint update.
DEFAULT_DRAIN_TIMEOUT = 20.0
SESSION_RETRY_AFTER = 30  # seconds a client past --max-sessions is asked to wait
WARMUP_TOKENS = 8
CLIENT_CLOSED = 499  # nginx's code for a request whose client closed the connection first
CLIENT_CLOSED_KEY = "eagle3_target.client_closed"  # set on a request whose client hung up mid-response
OPEN_PATHS = {"/" + contract.LIVEZ, "/" + contract.READYZ, "/" + contract.HEALTH, "/" + contract.METRICS}


@dataclass
class ServerOptions:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    session_ttl: float = 3600.0
    exit_on_disconnect: bool = False
    auth_token: str | None = None
    nccl_port: int | None = None  # tried first for a client that names no port; inside the range
    nccl_port_range: PortRange | None = None  # the rendezvous ports; a port a client names must lie in it
    p2p: bool = True
    p2p_timeout: float = 120.0  # each point-to-point transfer
    p2p_rendezvous_timeout: float = 30.0  # an /init_nccl nobody completes frees its port after this
    p2p_idle_timeout: float = 45.0  # a heartbeating session silent this long loses its group
    allow_unauthenticated_p2p: bool = False  # NeMo's mode, when an auth token is set
    keepalive_timeout: float = 30.0  # idle connections, and ones still sending headers, are closed
    max_sessions: int = DEFAULT_MAX_SESSIONS
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    write_timeout: float = 60.0  # a client that takes no 4 MiB slice of a response in this long is dropped


class TargetServer:
    """One target model behind HTTP. Build with a loader; the model loads after the listener is up."""

    def __init__(self, loader: Callable[[], TargetRunner], options: ServerOptions | None = None):
        self.loader = loader
        self.options = options or ServerOptions()
        self.metrics = ServerMetrics()
        self.sessions = SessionTable(self.options.session_ttl, max_sessions=self.options.max_sessions)
        self.runner: TargetRunner | None = None
        self.load_error: BaseException | None = None
        self.stopped = asyncio.Event()  # set by --exit-on-disconnect or a failed load
        self.draining = False  # SIGTERM: finish what is in flight, take nothing new
        self._busy = 0  # requests in flight that a drain waits for
        self._model_thread = ThreadPoolExecutor(1, thread_name_prefix="target-model")
        self._compute_lock = asyncio.Lock()
        self.dataplane = DataPlane(
            self.options.nccl_port_range,
            enabled=self.options.p2p,
            preferred_port=self.options.nccl_port,
            require_auth=bool(self.options.auth_token) and not self.options.allow_unauthenticated_p2p,
            rendezvous_timeout=self.options.p2p_rendezvous_timeout,
            transfer_timeout=self.options.p2p_timeout,
            idle_timeout=self.options.p2p_idle_timeout,
            registry=self.metrics.registry,
        )
        self.sessions.on_end(self.dataplane.end_session)

    # -- lifecycle -------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.options.max_body_bytes,
            middlewares=[self._observe, self._json_errors, self._authenticate, self._identity_bodies],
        )
        app.add_routes(
            [
                web.get("/" + contract.HEALTH, self.health, name=contract.HEALTH),
                web.get("/" + contract.READYZ, self.health, name=contract.READYZ),
                web.get("/" + contract.LIVEZ, self.livez, name=contract.LIVEZ),
                web.get("/" + contract.METRICS, self.prometheus, name=contract.METRICS),
                web.post("/" + contract.HEARTBEAT, self.heartbeat, name=contract.HEARTBEAT),
                web.post("/" + contract.MODEL_INFO, self.model_info, name=contract.MODEL_INFO),
                web.post(
                    "/" + contract.INPUT_EMBEDDINGS, self.input_embeddings, name=contract.INPUT_EMBEDDINGS
                ),
                web.post(
                    "/" + contract.SET_VOCAB_MAPPING, self.set_vocab_mapping, name=contract.SET_VOCAB_MAPPING
                ),
                web.post("/" + contract.INIT_NCCL, self.init_nccl, name=contract.INIT_NCCL),
                web.post("/" + contract.GENERATE, self.generate, name=contract.GENERATE),
                web.post("/" + contract.DISCONNECT, self.disconnect, name=contract.DISCONNECT),
                web.post("/" + contract.LM_HEAD, self.lm_head, name=contract.LM_HEAD),
            ]
        )
        app.on_shutdown.append(self._close_dataplane)  # before in-flight handlers are waited for
        app.cleanup_ctx.append(self._background)
        return app

    def app_runner(self, **kwargs) -> web.AppRunner:
        """The AppRunner this server is meant to be served by: its connection limits included."""
        return web.AppRunner(
            self.app(),
            access_log=None,
            # aiohttp's keep-alive timer also runs from connection start until a request's headers
            # are complete, so it reaps idle connections and slow-header (slowloris) ones alike.
            keepalive_timeout=self.options.keepalive_timeout,
            auto_decompress=False,  # no client compresses: no decompression bombs; see _identity_bodies
            **kwargs,
        )

    async def _close_dataplane(self, _app: web.Application) -> None:
        await self.dataplane.close()

    async def _background(self, _app: web.Application):
        tasks = [
            asyncio.create_task(self._load()),
            asyncio.create_task(self._expire_sessions()),
            asyncio.create_task(self.dataplane.watch()),
        ]
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.sessions.end_all()
        self.metrics.sessions.set(0)
        await self.dataplane.close()
        if self.runner is not None:
            await self._on_model_thread(self.runner.close)
        self._model_thread.shutdown(wait=False)

    async def drain(self) -> None:
        """Stop taking work and wait, up to drain_timeout, for the requests in flight to finish."""
        self.draining = True
        self.metrics.ready.set(0)
        log.info("draining: %d requests in flight, up to %.0fs", self._busy, self.options.drain_timeout)
        if self.runner is None:
            return  # still loading: nothing to finish
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.options.drain_timeout):
                while self._busy:
                    await asyncio.sleep(0.05)
        if self._busy:
            log.warning("drain timeout: %d requests still in flight are dropped", self._busy)

    async def _on_model_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._model_thread, fn, *args)

    async def _load(self) -> None:
        start = time.perf_counter()
        try:
            runner = await self._on_model_thread(self.loader)
            await self._on_model_thread(_warm_up, runner)
        except Exception as exc:
            log.exception("loading the target model failed")
            self.load_error = exc
            self.stopped.set()
            return
        self.runner = runner
        elapsed = time.perf_counter() - start
        info = runner.info
        self.metrics.model_load_seconds.set(elapsed)
        self.metrics.model.info(
            {k: str(v) for k, v in info.model_info().to_json().items() if k != "aux_layer_ids"}
        )
        self.metrics.ready.set(1)
        log.info(
            "ready: %s (%s, %d layers, hidden %d, vocab %d, aux layers %s, %s on %s) loaded and warmed in %.1fs",
            info.model,
            info.engine,
            info.num_hidden_layers,
            info.hidden_size,
            info.vocab_size,
            info.aux_layer_ids,
            info.dtype,
            info.device,
            elapsed,
        )

    async def _expire_sessions(self) -> None:
        period = max(1.0, min(60.0, self.options.session_ttl / 4)) if self.options.session_ttl > 0 else 60.0
        while True:
            await asyncio.sleep(period)
            for sid in self.sessions.expire():
                log.info("session %s expired after %.0fs idle", sid, self.options.session_ttl)
            self.metrics.sessions.set(len(self.sessions))

    # -- middlewares -----------------------------------------------------------------------

    @web.middleware
    async def _observe(self, request: web.Request, handler):
        route = request.match_info.route.name or "unmatched"
        start = time.perf_counter()
        code = 500
        self.metrics.in_flight.inc()
        waited_for = route != contract.INIT_NCCL  # a pending rendezvous is abandoned, not waited for
        self._busy += waited_for
        try:
            response = await handler(request)
            code = CLIENT_CLOSED if request.get(CLIENT_CLOSED_KEY) else response.status
            return response
        except web.HTTPException as exc:
            code = exc.status
            raise
        except ConnectionError:
            code = CLIENT_CLOSED  # the client went away mid-response: not a server error
            raise
        finally:
            self._busy -= waited_for
            self.metrics.in_flight.dec()
            self.metrics.requests.labels(route, str(code)).inc()
            self.metrics.request_seconds.labels(route).observe(time.perf_counter() - start)

    @web.middleware
    async def _json_errors(self, request: web.Request, handler):
        try:
            return await handler(request)
        except RequestError as exc:
            return _error(exc.status, exc.error, exc.detail)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            detail = {
                404: f"no endpoint {request.path}",
                405: f"{request.method} is not allowed on {request.path}; allowed: {exc.headers.get('Allow', '')}",
            }.get(exc.status, exc.text or exc.reason)
            return _error(exc.status, exc.reason.lower().replace(" ", "_"), detail, exc.headers)
        except (ConnectionError, asyncio.CancelledError):  # the client went away: nothing to answer
            raise
        except Exception as exc:
            log.exception("%s %s failed", request.method, request.path)
            return _error(500, "internal_error", f"{type(exc).__name__}: {exc}")

    @web.middleware
    async def _authenticate(self, request: web.Request, handler):
        token = self.options.auth_token
        if token and request.path not in OPEN_PATHS:
            given = request.headers.get("Authorization", "")
            # aiohttp keeps non-UTF-8 header bytes as surrogates: encode them back, never raise.
            given = given.encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, f"Bearer {token}".encode()):
                raise RequestError(401, "unauthorized", "this server needs 'Authorization: Bearer <token>'")
        return await handler(request)

    @web.middleware
    async def _identity_bodies(self, request: web.Request, handler):
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding != "identity":
            raise RequestError(
                415, "unsupported_content_encoding", f"bodies must be sent as-is, not {encoding!r}"
            )
        return await handler(request)

    # -- helpers ---------------------------------------------------------------------------

    def _ready_runner(self) -> TargetRunner:
        if self.draining:
            raise RequestError(503, "draining", "this server is shutting down; use another")
        if self.runner is None:
            raise RequestError(503, "not_ready", "the target model is still loading")
        return self.runner

    @staticmethod
    def _session_id(request: web.Request) -> str:
        """The X-Eagle3-Session header, or the peer address for a client that sends none (stock NeMo)."""
        return session_id(request.headers.get(contract.SESSION_HEADER), request.remote)

    def _session(self, request: web.Request) -> Session:
        try:
            session = self.sessions.touch(self._session_id(request))
        except SessionLimit as exc:
            # Live sessions keep working; a new one waits for an old one to end or expire.
            raise web.HTTPTooManyRequests(
                text=str(exc), headers={"Retry-After": str(SESSION_RETRY_AFTER)}
            ) from None
        self.metrics.sessions.set(len(self.sessions))
        return session

    async def _stream_blob(self, request: web.Request, blob: EncodedBlob, headers=None) -> web.StreamResponse:
        """Write a wire blob piece by piece from tensor storage: no joined copy of the body."""
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream", **(headers or {})})
        response.content_length = blob.nbytes
        try:
            await response.prepare(request)
            for chunk in blob.chunks():
                async with asyncio.timeout(self.options.write_timeout):
                    await response.write(chunk)
            await response.write_eof()
        except (ConnectionError, TimeoutError) as exc:
            # The client hung up (routine for a trainer that was stopped) or stopped reading
            # (TimeoutError: --write-timeout). abort(), not close(): close() waits for a stalled
            # reader to drain. asyncio keeps exc in a reference cycle (a drain future and the
            # frames awaiting it), which would hold this response's tensors until the cyclic GC.
            log.debug("%s %s: client went away mid-response: %r", request.method, request.path, exc)
            if request.transport is not None:
                request.transport.abort()
            _forget_traceback(exc)
            request[CLIENT_CLOSED_KEY] = True
        return response

    # -- endpoints -------------------------------------------------------------------------

    async def livez(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "alive", "ready": self.runner is not None})

    async def health(self, request: web.Request) -> web.Response:
        if self.draining:
            return web.json_response({"status": "draining"}, status=503)
        if self.runner is None:
            return web.json_response({"status": "loading"}, status=503)
        return web.json_response({"status": "ok"})

    async def prometheus(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def heartbeat(self, request: web.Request) -> web.Response:
        self._session(request)
        self.metrics.heartbeat_timestamp.set(time.time())
        return web.json_response({"status": "ok"})

    async def model_info(self, request: web.Request) -> web.Response:
        runner = self._ready_runner()
        self._session(request)
        info = runner.info.model_info(
            nccl_port=self.options.nccl_port, p2p=self.dataplane.info(runner.info.device)
        )
        return web.json_response(info.to_json())

    async def input_embeddings(self, request: web.Request) -> web.StreamResponse:
        runner = self._ready_runner()
        self._session(request)
        # Not cached: on a GPU the host copy is ~1 GB for an 8B model, and each trainer asks once.
        # On the CPU .cpu() is a view, so the blob streams straight from the model's own weight.
        weight = await self._on_model_thread(lambda: runner.input_embeddings().detach().cpu())
        return await self._stream_blob(request, EncodedBlob({"weight": weight}))

    async def set_vocab_mapping(self, request: web.Request) -> web.Response:
        runner = self._ready_runner()
        session = self._session(request)
        body = bytearray(await request.read())
        # Off the event loop: validating a 64 MiB body must not stall /livez and /health.
        vocab = await asyncio.to_thread(parse_vocab_mapping, body, runner.info.vocab_size, runner.info.device)
        if (
            session.id.startswith(PEER_PREFIX)
            and session.vocab is not None
            and not _same(session.vocab, vocab)
        ):
            # Header-less (NeMo) trainers on one node share this session: the last mapping wins for all.
            log.warning(
                "session %s: a different vocab mapping replaces the current one; trainers sharing an "
                "address should each send %s",
                session.id,
                contract.SESSION_HEADER,
            )
            self.metrics.peer_mapping_conflicts.inc()
        session.vocab = vocab  # a forward already running keeps the mapping it was handed
        return web.json_response({"status": "ok"})

    async def lm_head(self, request: web.Request) -> web.StreamResponse:
        """Our extension: the lm_head rows of the session's draft vocabulary, for the "hidden" encoding."""
        runner = self._ready_runner()
        session = self._session(request)
        _offered(runner, encodings.HIDDEN)
        vocab = _vocab(session)
        rows = await self._on_model_thread(lambda: runner.lm_head_rows(vocab.selected_token_ids).cpu())
        return await self._stream_blob(request, EncodedBlob({"weight": rows}))

    async def init_nccl(self, request: web.Request) -> web.Response:
        runner = self._ready_runner()
        session = self._session(request)
        body = await request.read()
        if len(body) > INIT_NCCL_MAX_BYTES:  # parsed on the event loop: keep it small
            raise RequestError(
                413, "request_entity_too_large", f"/init_nccl takes at most {INIT_NCCL_MAX_BYTES} bytes"
            )
        # The store binds the address this request reached: our pod address, never a wildcard.
        address = request.transport.get_extra_info("sockname")[0]
        return web.json_response(await self.dataplane.init(session, address, body, runner.info.device))

    async def generate(self, request: web.Request) -> web.StreamResponse:
        runner = self._ready_runner()
        session = self._session(request)
        timings: dict[str, float] = {}
        start = time.perf_counter()
        body = bytearray(await request.read())
        inputs = await asyncio.to_thread(
            parse_generate, body, runner.info.vocab_size, self.options.max_batch_tokens
        )
        encoding = _offered(runner, request.headers.get(contract.ENCODING_HEADER, encodings.NEMO))
        vocab = _vocab(session)
        timings["decode"] = time.perf_counter() - start
        async with self.dataplane.transfer(session, request.headers) as transfer:
            if transfer is not None:
                return await self._generate_p2p(request, runner, inputs, session, transfer, timings, encoding)
        async with self._compute_lock:
            supervision = await self._on_model_thread(_compute, runner, inputs, vocab, encoding, timings)
        start = time.perf_counter()
        blob = EncodedBlob(supervision)
        timings["encode"] = time.perf_counter() - start

        start = time.perf_counter()
        headers = {"Server-Timing": _server_timing(timings), contract.ENCODING_HEADER: encoding}
        response = await self._stream_blob(request, blob, headers)
        timings["send"] = time.perf_counter() - start
        self._record_generate(timings, inputs, "wire", blob.nbytes)
        return response

    async def _generate_p2p(
        self, request, runner, inputs, session, transfer, timings, encoding
    ) -> web.StreamResponse:
        """Metadata in the HTTP response, flushed, then the tensors over the session's group."""
        async with self._compute_lock:
            supervision = await self._on_model_thread(
                _compute, runner, inputs, _vocab(session), encoding, timings, False
            )
        response = web.Response(
            body=metadata.encode_metadata(supervision),
            content_type="application/json",
            headers={
                **transfer.response_headers(),
                "Server-Timing": _server_timing(timings),
                contract.ENCODING_HEADER: encoding,
            },
        )
        await response.prepare(request)
        await response.write_eof()  # the client must have the metadata before it can post its receives
        start = time.perf_counter()
        try:
            sent = await transfer.send(supervision)
        except TransferError as exc:
            # A 200 is already on the wire: write nothing more, drop the connection instead.
            log.warning("session %s: point-to-point send failed, closing the connection: %s", session.id, exc)
            request.protocol.force_close()
            return response
        timings["send"] = time.perf_counter() - start
        # "nccl" names the point-to-point path, gloo included.
        self._record_generate(timings, inputs, "nccl", sent)
        return response

    def _record_generate(
        self, timings: dict[str, float], inputs: dict[str, torch.Tensor], path: str, sent: int
    ):
        for phase, seconds in timings.items():
            self.metrics.generate_phase_seconds.labels(phase).observe(seconds)
        self.metrics.tokens.inc(inputs["input_ids"].numel())
        self.metrics.sent_bytes.labels(path).inc(sent)

    async def disconnect(self, request: web.Request) -> web.Response:
        sid = self._session_id(request)
        if self.sessions.end(sid):
            log.info("session %s disconnected", sid)
        self.metrics.sessions.set(len(self.sessions))
        if self.options.exit_on_disconnect:
            log.info("--exit-on-disconnect: stopping after this response")
            asyncio.get_running_loop().call_soon(self.stopped.set)
        return web.json_response({"status": "ok"})


def _forget_traceback(exc: BaseException | None) -> None:
    """Cut an exception (and its context) loose from its frames and their local variables."""
    while exc is not None:
        traceback.clear_frames(exc.__traceback__)
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


def _server_timing(timings: dict[str, float]) -> str:
    """The standard Server-Timing header: lets a client tell compute from transfer time."""
    return ", ".join(f"{phase};dur={seconds * 1000:.3f}" for phase, seconds in timings.items())


def _error(status: int, error: str, detail: str, headers=None) -> web.Response:
    keep = {k: v for k, v in (headers or {}).items() if k.lower() in ("allow", "retry-after")}
    return web.json_response({"error": error, "detail": detail}, status=status, headers=keep)


def _offered(runner: TargetRunner, encoding: str) -> str:
    if encoding not in runner.info.encodings:
        raise RequestError(
            400,
            "encoding_not_offered",
            f"encoding {encoding!r} is not offered; this server offers {', '.join(runner.info.encodings)}",
        )
    return encoding


def _same(a: VocabMapping, b: VocabMapping) -> bool:
    return torch.equal(a.selected_token_ids, b.selected_token_ids) and torch.equal(
        a.selected_token_mask, b.selected_token_mask
    )


def _vocab(session: Session) -> VocabMapping:
    if session.vocab is None:
        raise RequestError(
            409, "no_vocab_mapping", "this session has no vocab mapping: call /set_vocab_mapping first"
        )
    return session.vocab


def _warm_up(runner: TargetRunner) -> None:
    """One tiny forward and projection, so the first real request pays no lazy initialisation."""
    device = runner.info.device
    ids = torch.zeros(1, WARMUP_TOKENS, dtype=torch.long, device=device)
    logits, aux = runner.forward(ids, torch.ones_like(ids))
    build_supervision(logits, aux, ids, ids, VocabMapping.identity(logits.shape[-1], device))


def _compute(
    runner: TargetRunner,
    inputs: dict[str, torch.Tensor],
    vocab: VocabMapping,
    encoding: str,
    timings: dict[str, float],
    to_host=True,
):
    """On the model thread: forward, projection into the encoding, and (for the wire) the move to host memory."""
    device = runner.info.device
    start = time.perf_counter()
    input_ids = inputs["input_ids"].to(device)
    attention_mask = inputs["attention_mask"].to(device)
    hidden = None
    if encoding == encodings.HIDDEN:
        logits, aux, hidden = runner.forward_hidden(input_ids, attention_mask)
    else:
        logits, aux = runner.forward(input_ids, attention_mask)
    timings["forward"] = time.perf_counter() - start
    start = time.perf_counter()
    loss_mask = inputs["loss_mask"].to(device)
    supervision = encodings.encode(encoding, logits, aux, input_ids, loss_mask, vocab, hidden)
    del logits, hidden
    if to_host:
        supervision = {k: v.cpu() for k, v in supervision.items()}
    else:  # the point-to-point path sends straight from the runner's device
        supervision = {k: v.contiguous() for k, v in supervision.items()}
    timings["projection"] = time.perf_counter() - start
    return supervision


def listen(host: str, port: int) -> socket.socket:
    """The bound listening socket (IPv6 when the host is an IPv6 literal); raises OSError if taken. "::" binds
    every address of both families where the kernel allows dual-stack sockets (IPv4 arrives v4-mapped)."""
    if ":" not in host:
        return socket.create_server((host, port), family=socket.AF_INET, backlog=1024)
    dual = host == "::" and socket.has_dualstack_ipv6()
    return socket.create_server((host, port), family=socket.AF_INET6, dualstack_ipv6=dual, backlog=1024)


def _raise_fd_limit() -> None:
    """Every connection is a file descriptor: take the hard limit, not the soft 1024 most images start with."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
        return
    log.info("open-file limit raised from %d to %d", soft, target)


def run_server(server: TargetServer, *socks: socket.socket) -> NoReturn:
    """Serve on every one of ``socks`` until SIGINT/SIGTERM, --exit-on-disconnect, or a failed model load; then exit.

    SIGTERM drains: readiness and new model requests answer 503 at once, requests in flight are
    finished and delivered for up to --drain-timeout, then the process exits without waiting for
    its threads (a model still loading, a rendezvous waiting for a peer that will never come).
    """

    async def main() -> int:
        signalled = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, signalled.set)
        _raise_fd_limit()
        runner = server.app_runner(shutdown_timeout=1.0)
        await runner.setup()
        for sock in socks:
            site = web.SockSite(runner, sock)
            await site.start()
            log.info("listening on %s (model loading in the background)", site.name)
        stopped = asyncio.create_task(server.stopped.wait())
        await asyncio.wait(
            [stopped, asyncio.create_task(signalled.wait())], return_when=asyncio.FIRST_COMPLETED
        )
        try:
            if signalled.is_set():
                await server.drain()
        finally:
            with contextlib.suppress(Exception):
                await runner.cleanup()
        return 1 if server.load_error else 0

    code = asyncio.run(main())
    # Interpreter shutdown would join the worker threads: a model load or a rendezvous can take
    # minutes, past Kubernetes' grace period. Nothing they hold needs saving.
    logging.shutdown()
    os._exit(code)
