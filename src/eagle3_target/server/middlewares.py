"""The HTTP layer's middlewares, outermost first: observe (metrics, in-flight count), errors (the one
place a failure becomes a status code and a JSON body {"error", "detail"}, or OpenAI's shape under /v1),
authenticate, identity bodies, bounded bodies (a declared size checked before, and a deadline on, reading the
body)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time

from aiohttp import web

from eagle3_target.protocol import contract

from . import errors
from .metrics import ServerMetrics
from .openai_replies import error_body

OPENAI_PREFIX = "/v1/"  # OpenAI's endpoints (openai_endpoints.py): errors in OpenAI's shape

log = logging.getLogger(__name__)

# Each domain error's status code; ServiceError itself (an error nobody classified) is a 400.
STATUS: dict[type[errors.ServiceError], int] = {
    errors.ServiceError: 400,
    errors.InvalidInput: 400,
    errors.NotFound: 404,
    errors.Unauthorized: 401,
    errors.Forbidden: 403,
    errors.BodyTimeout: 408,
    errors.NoVocabMapping: 409,
    errors.TooLarge: 413,
    errors.OutOfRange: 422,
    errors.TooManySessions: 429,
    errors.QueueFull: 429,
    errors.NotReady: 503,
}
SESSION_RETRY_AFTER = 30  # seconds a client past --max-sessions is asked to wait
CLIENT_CLOSED = 499  # nginx's code for a request whose client closed the connection first
# Set on a request whose client hung up mid-response.
CLIENT_CLOSED_KEY = web.RequestKey("eagle3_target.client_closed", bool)
OPEN_PATHS = {"/" + contract.LIVEZ, "/" + contract.READYZ, "/" + contract.HEALTH, "/" + contract.METRICS}
# Paths with credentials of their own, checked by the service (the admin token of refresh.py), not the trainers'
ADMIN_PATHS = {"/" + p for p in (contract.REFRESH, contract.BROADCAST, contract.BROADCAST_OUTCOME)}


class InFlight:
    """Requests a drain waits for: all but /init_nccl, whose pending rendezvous is abandoned instead."""

    def __init__(self) -> None:
        self.count = 0

    async def settle(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the count to reach zero."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self.count:
                    await asyncio.sleep(0.05)


def error_response(
    status: int, error: str, detail: str, headers=None, *, openai: bool = False, param: str | None = None
) -> web.Response:
    """Our {"error", "detail"} body, or under /v1 (``openai``) OpenAI's {"error": {message, type, param, code}}."""
    keep = {k: v for k, v in (headers or {}).items() if k.lower() in ("allow", "retry-after")}
    body = error_body(status, error, detail, param) if openai else {"error": error, "detail": detail}
    return web.json_response(body, status=status, headers=keep)


def _openai(request: web.Request) -> bool:
    """OpenAI's paths (and unknown ones under /v1/); our own endpoint there keeps our shape."""
    return request.path.startswith(OPENAI_PREFIX) and request.path != contract.SPECULATIVE_EVALUATE


def endpoint(request: web.Request) -> str:
    """The metrics label: the route's name, also for a wrong method on it (GET /model_info), else unmatched."""
    name = request.match_info.route.name or request.path.removeprefix("/")
    return name if name in request.app.router.named_resources() else "unmatched"


def observe(metrics: ServerMetrics, in_flight: InFlight):
    @web.middleware
    async def middleware(request: web.Request, handler):
        route = endpoint(request)
        start = time.perf_counter()
        code = 500
        metrics.in_flight.inc()
        waited_for = route != contract.INIT_NCCL
        in_flight.count += waited_for
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
            in_flight.count -= waited_for
            metrics.in_flight.dec()
            metrics.requests.labels(route, str(code)).inc()
            metrics.request_seconds.labels(route).observe(time.perf_counter() - start)

    return middleware


@web.middleware
async def json_errors(request: web.Request, handler):
    response = await _answer(request, handler)
    if response.status >= 400 and not request.content.is_eof():
        # The body was refused unread (413 on its declared size, 408): the connection cannot carry another.
        response.force_close()
    return response


async def _answer(request: web.Request, handler) -> web.StreamResponse:
    openai = _openai(request)
    try:
        return await handler(request)
    except errors.ServiceError as exc:
        status = next(STATUS[c] for c in type(exc).__mro__ if c in STATUS)  # a subclass maps as its base
        wait = getattr(exc, "retry_after", SESSION_RETRY_AFTER)  # QueueFull says its own
        retry = {"Retry-After": str(wait)} if status == 429 else None
        return error_response(status, exc.error, exc.detail, retry, openai=openai, param=exc.param)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        detail = {
            404: f"no endpoint {request.path}",
            405: f"{request.method} is not allowed on {request.path}; allowed: {exc.headers.get('Allow', '')}",
        }.get(exc.status, exc.text or exc.reason)
        code = exc.reason.lower().replace(" ", "_")
        return error_response(exc.status, code, detail, exc.headers, openai=openai)
    except ConnectionError as exc:
        # The client hung up mid-request: one line, not aiohttp's traceback (which a ConnectionError
        # raised out of a handler gets). The answer goes nowhere; aiohttp drops it quietly.
        log.info(
            "%s %s: client %s hung up mid-request (%s)", request.method, request.path, request.remote, exc
        )
        request[CLIENT_CLOSED_KEY] = True
        return error_response(CLIENT_CLOSED, "client_closed", str(exc))
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.exception("%s %r failed", request.method, request.path)
        return error_response(500, "internal_error", f"{type(exc).__name__}: {exc}", openai=openai)


def authenticate(token: str | None):
    @web.middleware
    async def middleware(request: web.Request, handler):
        if token and request.path not in OPEN_PATHS and request.path not in ADMIN_PATHS:
            given = request.headers.get("Authorization", "")
            # aiohttp keeps non-UTF-8 header bytes as surrogates: encode them back, never raise.
            given = given.encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, f"Bearer {token}".encode()):
                return error_response(
                    401,
                    "invalid_api_key" if _openai(request) else "unauthorized",
                    "this server needs 'Authorization: Bearer <token>'",
                    openai=_openai(request),
                )
        return await handler(request)

    return middleware


@web.middleware
async def identity_bodies(request: web.Request, handler):
    """No client compresses: refuse compressed bodies instead of inflating them (no decompression bombs)."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding != "identity":
        return error_response(
            415,
            "unsupported_content_encoding",
            f"bodies must be sent as-is, not {encoding!r}",
            openai=_openai(request),
        )
    return await handler(request)


def bounded_bodies(max_bytes: int, timeout: float):
    """Refuse a declared Content-Length over ``max_bytes`` before reading a byte of it, and read every
    body in full within ``timeout`` seconds (handlers then get aiohttp's cached copy): a client that
    declares more than it sends holds a connection for ``timeout``, not forever."""

    @web.middleware
    async def middleware(request: web.Request, handler):
        declared = request.content_length
        if declared is not None and declared > max_bytes:
            raise errors.TooLarge(
                "request_entity_too_large",
                f"Content-Length {declared} is over this server's {max_bytes} bytes (--max-body-bytes)",
            )
        try:
            async with asyncio.timeout(timeout):
                await request.read()
        except TimeoutError:
            raise errors.BodyTimeout(
                "body_timeout",
                f"the request body did not arrive within {timeout:g} s (--body-timeout)",
            ) from None
        return await handler(request)

    return middleware
