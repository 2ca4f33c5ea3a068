"""One target server as the client sees it: plain HTTP calls under our session id.

Every method is a coroutine on the client's event loop and knows nothing of the
pool: what was agreed at join (agreement.py) and the data path of /generate
(fetch.py) live elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp
import torch

from eagle3_target.protocol import contract, wire
from eagle3_target.protocol.model_info import ModelInfo

from .body import read_tensors

# Failures that say "this server, now" rather than "this request": try another server.
TRANSIENT_ERRORS = (
    aiohttp.ClientConnectionError,
    aiohttp.ClientPayloadError,
    asyncio.TimeoutError,
    wire.WireError,
)


class ServerError(Exception):
    """A non-2xx answer. ``retryable`` for 5xx: the same request may succeed elsewhere."""

    def __init__(self, url: str, path: str, status: int, error: str, detail: str):
        super().__init__(f"{url}/{path}: HTTP {status} {error}: {detail}")
        self.url, self.path, self.status, self.error, self.detail = url, path, status, error, detail

    @property
    def retryable(self) -> bool:
        return self.status >= 500


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


async def read_body(response: aiohttp.ClientResponse) -> bytearray:
    """The whole body in one buffer sized by Content-Length: each chunk is copied once, never joined."""
    size = response.content_length
    if size is None:
        body = bytearray()
        async for chunk in response.content.iter_any():
            body += chunk
        return body
    body = bytearray(size)
    view = memoryview(body)
    filled = 0
    async for chunk in response.content.iter_any():
        end = filled + len(chunk)
        if end > size:
            raise aiohttp.ClientPayloadError(f"body longer than its Content-Length {size}")
        view[filled:end] = chunk
        filled = end
    if filled != size:
        raise aiohttp.ClientPayloadError(f"body ended after {filled} of {size} bytes")
    return body


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
    ):
        self.url = url
        self.http = http
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.headers = {contract.SESSION_HEADER: session_id}
        if auth_token:
            self.headers["Authorization"] = f"Bearer {auth_token}"
        self.pin_memory = torch.cuda.is_available()  # replies are received into pinned memory for the GPU

    def __repr__(self) -> str:
        return f"ServerConnection({self.url})"

    async def post(
        self,
        path: str,
        body: bytes = b"",
        timeout: aiohttp.ClientTimeout | None = None,
        headers: dict[str, str] | None = None,
    ):
        """POST and return the response with its body read; raise ServerError on non-2xx."""
        async with self._posting(path, body, timeout, headers) as response:
            return response, await read_body(response)

    async def post_tensors(
        self,
        path: str,
        body: bytes = b"",
        timeout: aiohttp.ClientTimeout | None = None,
        headers: dict[str, str] | None = None,
    ):
        """POST and return the response with its wire-blob body read into tensors (``read_tensors``)."""
        timeout = timeout or self.timeout
        async with self._posting(path, body, timeout, headers) as response:
            stall = timeout.sock_read or timeout.total
            return response, await read_tensors(response, self.pin_memory, stall)

    @contextlib.asynccontextmanager
    async def _posting(self, path: str, body: bytes, timeout: aiohttp.ClientTimeout | None, headers):
        async with self.http.post(
            f"{self.url}/{path}",
            data=body,
            headers={**self.headers, "Content-Type": "application/octet-stream", **(headers or {})},
            timeout=timeout or self.timeout,
        ) as response:
            if response.status >= 300:
                raise _server_error(self.url, path, response.status, await read_body(response))
            yield response

    async def post_json(
        self, path: str, body: bytes = b"", timeout: aiohttp.ClientTimeout | None = None
    ) -> dict[str, Any]:
        _, payload = await self.post(path, body, timeout)
        return json.loads(payload)

    async def health(self, timeout: float = 5.0) -> tuple[int, dict[str, Any]]:
        """(status code, JSON body) of GET /health: 200 once ready, 503 while loading."""
        async with self.http.get(
            f"{self.url}/{contract.HEALTH}",
            headers=self.headers,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            try:
                body = await response.json(content_type=None)
            except ValueError:
                body = {}
            return response.status, body if isinstance(body, dict) else {}

    async def livez(self, timeout: float = 5.0) -> tuple[int, dict[str, Any]]:
        """Our extension; a stock NeMo server answers 404."""
        async with self.http.get(
            f"{self.url}/{contract.LIVEZ}", headers=self.headers, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as response:
            try:
                return response.status, await response.json(content_type=None)
            except ValueError:
                return response.status, {}

    async def model_info(self) -> ModelInfo:
        return ModelInfo.from_json(await self.post_json(contract.MODEL_INFO))

    async def lm_head(self) -> dict[str, torch.Tensor | None]:
        """The lm_head rows of our draft vocabulary, as sent (our extension, for the "hidden" encoding)."""
        _, tensors = await self.post_tensors(contract.LM_HEAD, timeout=self._stall_timeout())
        return tensors

    async def weight(self, name: str) -> dict[str, torch.Tensor | None]:
        """A whole weight of the target, as sent (our extension: /weights/<name>)."""
        path = f"{contract.WEIGHTS}/{name}"
        _, tensors = await self.post_tensors(path, timeout=self._stall_timeout())
        return tensors

    def _stall_timeout(self) -> aiohttp.ClientTimeout:
        """For big bodies: no total timeout, only one between reads."""
        return aiohttp.ClientTimeout(sock_read=self.timeout.total)

    async def heartbeat(self) -> None:
        await self.post_json(contract.HEARTBEAT)

    async def input_embeddings(self) -> torch.Tensor:
        # About 1 GB for an 8B model: no total timeout, only a stall timeout between reads.
        _, tensors = await self.post_tensors(contract.INPUT_EMBEDDINGS, timeout=self._stall_timeout())
        weight = tensors.get("weight")
        if weight is None:
            raise wire.WireError(f"{self.url}/{contract.INPUT_EMBEDDINGS}: response has no 'weight'")
        return weight

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


def _server_error(url: str, path: str, status: int, payload: bytes) -> ServerError:
    try:
        doc = json.loads(payload)
        error, detail = str(doc.get("error", "")), str(doc.get("detail", ""))
    except (ValueError, AttributeError):
        error, detail = "", bytes(payload[:200]).decode("utf-8", "replace")
    return ServerError(url, path, status, error or f"http_{status}", detail)
