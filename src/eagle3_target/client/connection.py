"""One target server as the client sees it: plain HTTP calls under our session id.

Every method is a coroutine on the client's event loop and knows nothing of the
pool: what was agreed at join (agreement.py) and the data path of /generate
(fetch.py) live elsewhere. Every body is read under a limit (limits.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import aiohttp
import torch

from eagle3_target.protocol import contract, wire
from eagle3_target.protocol.model_info import ModelInfo

from .body import read_tensors
from .errors import ServerFault
from .limits import ERROR_LIMIT, JSON_LIMIT, parse_json, read_limited

# Failures that say "this server, now" rather than "this request": try another server.
TRANSIENT_ERRORS = (
    aiohttp.ClientError,  # connection errors, bad framing, a bad status line or header
    asyncio.TimeoutError,
    wire.WireError,
    ServerFault,
)
# 4xx answers that are the server's state, not our request: a lost session (409 beyond the one
# recovery in fetch.py), throttling (429), a timeout on its side.
SERVER_STATE_STATUSES = (408, 409, 425, 429)
MAX_RETRY_AFTER = 60.0  # seconds; a longer Retry-After is read as this


class ServerError(Exception):
    """A non-2xx answer. ``retryable``: the same request may succeed elsewhere (5xx, or a 4xx that
    says something about the server's state). ``retry_after``: seconds a 429 asked us to wait."""

    def __init__(
        self, url: str, path: str, status: int, error: str, detail: str, retry_after: float | None = None
    ):
        super().__init__(f"{url}/{path}: HTTP {status} {error}: {detail}")
        self.url, self.path, self.status, self.error, self.detail = url, path, status, error, detail
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.status >= 500 or self.status in SERVER_STATE_STATUSES


class RequestRejected(ServerError):
    """Every server the pool could ask refused the caller's own request (a 4xx such as a batch over the
    token cap or ids out of the vocabulary): the one error a request's own fault raises to the trainer."""


def parse_server_timing(header: str) -> dict[str, float]:
    """'forward;dur=50.1, encode;dur=0.2' -> {'forward': 0.0501, 'encode': 0.0002} (seconds)."""
    out = {}
    for item in header.split(","):
        name, *params = (p.strip() for p in item.split(";"))
        for param in params:
            key, _, value = param.partition("=")
            if key == "dur" and name:
                with contextlib.suppress(ValueError):
                    out[name] = float(value) / 1000
    return out


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the delay form; an HTTP date is not backpressure we honour), capped."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    if seconds is None or not 0 <= seconds < float("inf"):
        return None
    return min(seconds, MAX_RETRY_AFTER)


class ServerConnection:
    """HTTP calls to one server, all under one session id (the server keeps our vocab mapping per session)."""

    def __init__(
        self,
        url: str,
        http: aiohttp.ClientSession,
        session_id: str,
        *,
        auth_token: str | None = None,
        timeout: float = 120.0,
        priority: str | None = None,
    ):
        self.url = url
        self.http = http
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.headers = {contract.SESSION_HEADER: session_id}
        if auth_token:
            self.headers["Authorization"] = f"Bearer {auth_token}"
        if priority:
            self.headers[contract.PRIORITY_HEADER] = priority
        self.pin_memory = torch.cuda.is_available()  # replies are received into pinned memory for the GPU

    def __repr__(self) -> str:
        return f"ServerConnection({self.url})"

    async def post(
        self,
        path: str,
        body: bytes = b"",
        timeout: aiohttp.ClientTimeout | None = None,
        headers: dict[str, str] | None = None,
        limit: int = JSON_LIMIT,
    ):
        """POST and return the response with its body read (at most ``limit`` bytes); raise ServerError
        on non-2xx."""
        async with self._posting(path, body, timeout, headers) as response:
            return response, await read_limited(response, limit)

    async def post_tensors(
        self,
        path: str,
        body: bytes = b"",
        timeout: aiohttp.ClientTimeout | None = None,
        headers: dict[str, str] | None = None,
        *,
        limit: int,
    ):
        """POST and return the response with its wire-blob body (at most ``limit`` bytes) read into
        tensors (``read_tensors``). ``timeout.total`` bounds the whole attempt, the direct socket
        read included (aiohttp's own timer no longer watches once the socket is ours)."""
        timeout = timeout or self.timeout
        async with asyncio.timeout(timeout.total), self._posting(path, body, timeout, headers) as response:
            stall = timeout.sock_read or timeout.total
            return response, await read_tensors(response, limit, self.pin_memory, stall)

    @contextlib.asynccontextmanager
    async def _posting(self, path: str, body: bytes, timeout: aiohttp.ClientTimeout | None, headers):
        async with self.http.post(
            f"{self.url}/{path}",
            data=body,
            headers={**self.headers, "Content-Type": "application/octet-stream", **(headers or {})},
            timeout=timeout or self.timeout,
        ) as response:
            if response.status >= 300:
                payload = await read_limited(response, ERROR_LIMIT, truncate=True)
                raise _server_error(self.url, path, response, payload)
            try:
                yield response
            except BaseException:
                response.close()  # a body read in part, or refused: never reuse this connection
                raise

    async def post_json(
        self, path: str, body: bytes = b"", timeout: aiohttp.ClientTimeout | None = None
    ) -> dict[str, Any]:
        _, payload = await self.post(path, body, timeout)
        doc = parse_json(payload, f"{self.url}/{path}")
        if not isinstance(doc, dict):
            raise ServerFault(f"{self.url}/{path}: the reply is not a JSON object")
        return doc

    async def _get_json(self, path: str, timeout: float) -> tuple[int, dict[str, Any]]:
        """(status, JSON object or {}) of a GET whose body only informs: read under the JSON limit."""
        async with self.http.get(
            f"{self.url}/{path}", headers=self.headers, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as response:
            payload = await read_limited(response, JSON_LIMIT, truncate=response.status >= 300)
            try:
                body = parse_json(payload, path)
            except ServerFault:
                body = {}
            return response.status, body if isinstance(body, dict) else {}

    async def health(self, timeout: float = 5.0) -> tuple[int, dict[str, Any]]:
        """(status code, JSON body) of GET /health: 200 once ready, 503 while loading."""
        return await self._get_json(contract.HEALTH, timeout)

    async def livez(self, timeout: float = 5.0) -> tuple[int, dict[str, Any]]:
        """Our extension; a stock NeMo server answers 404."""
        return await self._get_json(contract.LIVEZ, timeout)

    async def model_info(self) -> ModelInfo:
        return ModelInfo.from_json(await self.post_json(contract.MODEL_INFO))

    async def weight(self, path: str, limit: int) -> tuple[Mapping[str, str], dict[str, torch.Tensor | None]]:
        """A weight blob (/input_embeddings, /lm_head) of at most ``limit`` bytes, as sent (fetch.py checks
        it). About 1 GB for an 8B model's embeddings: the stall timeout is request_timeout between reads,
        the whole read may take that plus one second per MiB (a trickle still ends)."""
        total = self.timeout.total + limit / (1 << 20) if self.timeout.total else None
        timeout = aiohttp.ClientTimeout(total=total, sock_read=self.timeout.total)
        response, tensors = await self.post_tensors(path, timeout=timeout, limit=limit)
        return response.headers, tensors

    async def heartbeat(self) -> None:
        await self.post_json(contract.HEARTBEAT)

    async def set_vocab_mapping(self, blob: bytes) -> None:
        """Send the mapping: the wire blob of selected_token_ids and selected_token_mask."""
        await self.post_json(contract.SET_VOCAB_MAPPING, blob)

    async def init_nccl(self, body: bytes) -> dict[str, Any]:
        """Ask for a p2p group (NeMo's endpoint name); the reply says where to join it."""
        return await self.post_json(contract.INIT_NCCL, body)

    async def disconnect(self, timeout: float | None = None) -> None:
        """End our session only; the server keeps running for its other clients."""
        limit = None if timeout is None else aiohttp.ClientTimeout(total=timeout)
        await self.post_json(contract.DISCONNECT, b"{}", limit)


def _server_error(url: str, path: str, response: aiohttp.ClientResponse, payload: bytes) -> ServerError:
    try:
        doc = parse_json(payload, path)
        error, detail = str(doc.get("error", ""))[:200], str(doc.get("detail", ""))[:500]
    except (ServerFault, AttributeError):
        error, detail = "", bytes(payload[:200]).decode("utf-8", "replace")
    status = response.status
    retry_after = parse_retry_after(response.headers.get("Retry-After")) if status == 429 else None
    return ServerError(url, path, status, error or f"http_{status}", detail, retry_after)
