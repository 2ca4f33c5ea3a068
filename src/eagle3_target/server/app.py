"""The HTTP layer: NeMo's eight endpoints plus liveness, readiness and metrics, over TargetService, and
OpenAI's generation endpoints (openai_endpoints.py).

Each handler reads what the request carries (session id, body, headers), asks the service, and
writes the answer: JSON, or a wire blob streamed straight from tensor storage. Status codes come
from middlewares.py alone.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from eagle3_target.protocol import binding, contract, encodings, metadata
from eagle3_target.protocol.rendezvous import TransferError
from eagle3_target.protocol.wire import EncodedBlob

from . import middlewares
from .lifecycle_endpoints import LifecycleEndpoints
from .metrics import ServerMetrics
from .openai_endpoints import OpenAIEndpoints
from .options import ServerOptions
from .pipeline import Answer, GenerateRequest
from .runners import TargetRunner
from .send import send_body
from .service import TargetService
from .sessions import session_id

log = logging.getLogger(__name__)


class TargetServer:
    """One target model behind HTTP. Build with a loader; the model loads after the listener is up."""

    def __init__(self, loader: Callable[[], TargetRunner], options: ServerOptions | None = None):
        self.options = options or ServerOptions()
        self.metrics = ServerMetrics()
        self.service = TargetService(loader, self.options, self.metrics)
        self.in_flight = middlewares.InFlight()

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.options.max_body_bytes,
            middlewares=[
                middlewares.observe(self.metrics, self.in_flight),
                middlewares.json_errors,
                middlewares.authenticate(self.options.auth_token),
                middlewares.identity_bodies,
                middlewares.bounded_bodies(self.options.max_body_bytes, self.options.body_timeout),
            ],
        )
        routes = {
            contract.HEALTH: (web.get, self.health),
            contract.READYZ: (web.get, self.health),
            contract.LIVEZ: (web.get, self.livez),
            contract.METRICS: (web.get, self.prometheus),
            contract.HEARTBEAT: (web.post, self.heartbeat),
            contract.MODEL_INFO: (web.post, self.model_info),
            contract.INPUT_EMBEDDINGS: (web.post, self.input_embeddings),
            contract.SET_VOCAB_MAPPING: (web.post, self.set_vocab_mapping),
            contract.INIT_NCCL: (web.post, self.init_nccl),
            contract.GENERATE: (web.post, self.generate),
            contract.DISCONNECT: (web.post, self.disconnect),
            contract.LM_HEAD: (web.post, self.lm_head),
        }
        app.add_routes([method("/" + name, handler, name=name) for name, (method, handler) in routes.items()])
        app.add_routes(LifecycleEndpoints(self.service).routes())  # /weights/refresh before /weights/{name}
        app.router.add_post(f"/{contract.WEIGHTS}/{{name}}", self.weight, name=contract.WEIGHTS)
        if self.options.generation.enabled:
            app.add_routes(OpenAIEndpoints(self.service.generation).routes())
        app.on_shutdown.append(self._close_p2p)  # before in-flight handlers are waited for
        app.cleanup_ctx.append(self._service_running)
        return app

    def app_runner(self, **kwargs) -> web.AppRunner:
        """The AppRunner this server is meant to be served by: its connection limits included."""
        return web.AppRunner(
            self.app(),
            access_log=None,
            # aiohttp's keep-alive timer also runs from connection start until a request's headers
            # are complete, so it reaps idle connections and slow-header (slowloris) ones alike.
            keepalive_timeout=self.options.keepalive_timeout,
            auto_decompress=False,  # no client compresses: see middlewares.identity_bodies
            **kwargs,
        )

    async def _close_p2p(self, _app: web.Application) -> None:
        await self.service.p2p.close()

    async def _service_running(self, _app: web.Application):
        async with self.service.running():
            yield

    async def drain(self) -> None:
        """Stop taking work and wait, up to drain_timeout, for the requests in flight to finish."""
        self.service.drain()
        self.metrics.ready.set(0)
        log.info(
            "draining: %d requests in flight, up to %.0fs", self.in_flight.count, self.options.drain_timeout
        )
        if self.service.model.runner is None:
            return  # still loading: nothing to finish
        await self.in_flight.settle(self.options.drain_timeout)
        if self.in_flight.count:
            log.warning("drain timeout: %d requests still in flight are dropped", self.in_flight.count)

    async def stream_blob(self, request: web.Request, blob: EncodedBlob, headers=None) -> web.StreamResponse:
        """Write a wire blob piece by piece from tensor storage: no copy of the body (send.py)."""
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream", **(headers or {})})
        response.content_length = blob.nbytes
        try:
            await response.prepare(request)
            chunks = blob.chunks()
            await response.write(next(chunks))  # the blob's magic goes out with the response head
            await send_body(request.transport, chunks, self.options.write_timeout)
            await response.write_eof()
        except (ConnectionError, TimeoutError) as exc:
            # The client hung up (routine for a trainer that was stopped) or stopped reading
            # (TimeoutError: --write-timeout). abort(), not close(): close() waits for a stalled
            # reader to drain. asyncio keeps exc in a reference cycle (a drain future and the
            # frames awaiting it), which would hold this response's tensors until the cyclic GC.
            log.debug("%s %r: client went away mid-response: %r", request.method, request.path, exc)
            if request.transport is not None:
                request.transport.abort()
            _forget_traceback(exc)
            request[middlewares.CLIENT_CLOSED_KEY] = True
        return response

    # -- endpoints -------------------------------------------------------------------------

    async def livez(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "alive", "ready": self.service.model.runner is not None})

    async def health(self, request: web.Request) -> web.Response:
        status = self.service.model.status()
        return web.json_response({"status": status}, status=200 if status == "ok" else 503)

    async def prometheus(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def heartbeat(self, request: web.Request) -> web.Response:
        self.service.clients.heartbeat(_session_id(request))
        return web.json_response({"status": "ok"})

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.service.clients.model_info(_session_id(request)).to_json())

    async def input_embeddings(self, request: web.Request) -> web.StreamResponse:
        weight, version = await self.service.weights.input_embeddings(_session_id(request))
        return await self.stream_blob(request, EncodedBlob({"weight": weight}), _version(version))

    async def set_vocab_mapping(self, request: web.Request) -> web.Response:
        await self.service.clients.set_vocab_mapping(_session_id(request), bytearray(await request.read()))
        return web.json_response({"status": "ok"})

    async def lm_head(self, request: web.Request) -> web.StreamResponse:
        rows, version = await self.service.weights.lm_head_rows(_session_id(request))
        return await self.stream_blob(request, EncodedBlob({"weight": rows}), _version(version))

    async def weight(self, request: web.Request) -> web.StreamResponse:
        tensor, version = await self.service.weights.weight(_session_id(request), request.match_info["name"])
        return await self.stream_blob(request, EncodedBlob({"weight": tensor}), _version(version))

    async def init_nccl(self, request: web.Request) -> web.Response:
        # The store binds the address this request reached: our pod address, never a wildcard.
        address = request.transport.get_extra_info("sockname")[0]
        reply = await self.service.clients.init_p2p(_session_id(request), address, await request.read())
        return web.json_response(reply)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        asked = GenerateRequest(
            session_id=_session_id(request),
            body=bytearray(await request.read()),
            encoding=request.headers.get(contract.ENCODING_HEADER, encodings.NEMO),
            p2p=request.headers.get(contract.NCCL_HEADER) == "1",
            sequence=request.headers.get(contract.SEQUENCE_HEADER),
            features=request.headers.get(contract.FEATURES_HEADER),
            priority=request.headers.get(contract.PRIORITY_HEADER),
        )
        echo = binding.reply_headers(request.headers, asked.body)  # {} for a stock NeMo client
        async with self.service.pipeline.generate(asked) as answer:
            if answer.transfer is not None:
                return await self._deliver_p2p(request, answer, echo)
            start = time.perf_counter()
            blob = EncodedBlob(answer.supervision)
            answer.timings["encode"] = time.perf_counter() - start
            start = time.perf_counter()
            headers = {"Server-Timing": _server_timing(answer.timings), **answer.headers(), **echo}
            response = await self.stream_blob(request, blob, headers)
            answer.timings["send"] = time.perf_counter() - start
            self.service.pipeline.delivered(answer, "wire", blob.nbytes)
            return response

    async def _deliver_p2p(
        self, request: web.Request, answer: Answer, echo: dict[str, str]
    ) -> web.StreamResponse:
        """Metadata in the HTTP response, flushed, then the tensors over the session's group."""
        transfer = answer.transfer
        response = web.Response(
            body=metadata.encode_metadata(answer.supervision),
            content_type="application/json",
            headers={
                **transfer.response_headers(),
                "Server-Timing": _server_timing(answer.timings),
                **answer.headers(),
                **echo,
            },
        )
        await response.prepare(request)
        await response.write_eof()  # the client must have the metadata before it can post its receives
        start = time.perf_counter()
        try:
            sent = await transfer.send(answer.supervision)
        except TransferError as exc:
            # A 200 is already on the wire: write nothing more, drop the connection instead.
            log.warning(
                "session %r: p2p send failed, closing the connection: %s", transfer.sg.session.id, exc
            )
            request.protocol.force_close()
            return response
        answer.timings["send"] = time.perf_counter() - start
        self.service.pipeline.delivered(answer, "p2p", sent)
        return response

    async def disconnect(self, request: web.Request) -> web.Response:
        self.service.clients.disconnect(_session_id(request))
        return web.json_response({"status": "ok"})


def _session_id(request: web.Request) -> str:
    """The X-Eagle3-Session header, or the peer address for a client that sends none (stock NeMo)."""
    return session_id(request.headers.get(contract.SESSION_HEADER), request.remote)


def _version(version: str | None) -> dict[str, str]:
    """The header naming the weights a reply was read from (none before a version is known)."""
    return {contract.TARGET_VERSION_HEADER: version} if version else {}


def _forget_traceback(exc: BaseException | None) -> None:
    """Cut an exception (and its context) loose from its frames and their local variables."""
    while exc is not None:
        traceback.clear_frames(exc.__traceback__)
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


def _server_timing(timings: dict[str, float]) -> str:
    """The standard Server-Timing header: lets a client tell compute from transfer time."""
    return ", ".join(f"{phase};dur={seconds * 1000:.3f}" for phase, seconds in timings.items())
