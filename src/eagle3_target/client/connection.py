"""One target server as the client sees it: its HTTP calls under our session id.

Every method is a coroutine on the client's event loop. The data path of
/generate lives in ``generate`` alone: it asks for the encoding negotiated at
join, takes the point-to-point channel when one is attached, and checks that the
reply is complete before returning, so an incomplete reply fails over like a
dropped connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any

import aiohttp
import torch

from eagle3_target.protocol import contract, encodings, wire
from eagle3_target.protocol.model_info import ModelInfo

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


class _BodySource:
    """A response body as a wire.ByteSource: aiohttp's received chunks copied once, into their final place."""

    def __init__(self, response: aiohttp.ClientResponse):
        self.content = response.content

    async def readinto(self, view: memoryview) -> None:
        filled = 0
        while filled < len(view):
            chunk = await self.content.read(len(view) - filled)
            if not chunk:
                raise aiohttp.ClientPayloadError(f"body ended {len(view) - filled} bytes early")
            view[filled : filled + len(chunk)] = chunk
            filled += len(chunk)


async def read_tensors(response: aiohttp.ClientResponse, pin_memory: bool = False) -> dict[str, Any]:
    """A wire-blob body as tensors, each read into its own storage as it arrives (wire.read_blob)."""
    size = response.content_length
    if size is None:  # no length to bound the allocations by: take the body first
        return wire.decode(await read_body(response))
    return await wire.read_blob(_BodySource(response), size, pin_memory=pin_memory)


@dataclass(frozen=True)
class Reply:
    """A checked /generate reply: the tensors of ``encoding`` (encodings.decode turns them into supervision)."""

    encoding: str
    tensors: dict[str, torch.Tensor]
    head_rows: torch.Tensor | None = None  # the draft vocabulary's lm_head rows, for "hidden"


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
        self.vocab_blob: bytes | None = None  # re-sent when the server has lost our session
        self.info: ModelInfo | None = None  # /model_info, read once per join
        self.encoding = encodings.NEMO  # negotiated at join
        self.p2p = None  # a p2p.P2PChannel, attached at join when the point-to-point path is negotiated
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
        async with self._posting(path, body, timeout, headers) as response:
            return response, await read_tensors(response, self.pin_memory)

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

    async def post_json(self, path: str, body: bytes = b"") -> dict[str, Any]:
        _, payload = await self.post(path, body)
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

    async def lm_head(self, draft_vocab: int) -> torch.Tensor:
        """The lm_head rows of our draft vocabulary [Vd, H] (our extension, for the "hidden" encoding)."""
        _, tensors = await self.post_tensors(
            contract.LM_HEAD, timeout=aiohttp.ClientTimeout(sock_read=self.timeout.total)
        )
        want = {"weight": (self._dtype(), (draft_vocab, self.info.hidden_size))}
        encodings.check(tensors, want)
        return tensors["weight"]

    def _dtype(self) -> torch.dtype | None:
        """The target dtype named by /model_info; None where it names none (a stock NeMo server)."""
        dtype = getattr(torch, str(self.info.dtype), None)
        return dtype if isinstance(dtype, torch.dtype) else None

    async def heartbeat(self) -> None:
        await self.post_json(contract.HEARTBEAT)

    async def input_embeddings(self) -> torch.Tensor:
        # About 1 GB for an 8B model: no total timeout, only a stall timeout between reads.
        _, tensors = await self.post_tensors(
            contract.INPUT_EMBEDDINGS, timeout=aiohttp.ClientTimeout(sock_read=self.timeout.total)
        )
        weight = tensors.get("weight")
        if weight is None:
            raise wire.WireError(f"{self.url}/{contract.INPUT_EMBEDDINGS}: response has no 'weight'")
        return weight

    async def set_vocab_mapping(self, blob: bytes | None = None) -> None:
        """Send the mapping (wire blob of selected_token_ids, selected_token_mask); None re-sends the last one."""
        if blob is not None:
            self.vocab_blob = blob
        if self.vocab_blob is None:
            raise RuntimeError("set_vocab_mapping has not been called")
        await self.post_json(contract.SET_VOCAB_MAPPING, self.vocab_blob)

    async def generate(self, request: bytes, batch: int, seq: int, draft_vocab: int) -> Reply:
        """One /generate of a [batch, seq] request: the reply in our encoding, checked complete.

        A 409 no_vocab_mapping means the server lost our session (restart or expiry): the
        mapping is re-sent and the request repeated once, which is safe since /generate is idempotent.
        """
        headers = {} if self.encoding == encodings.NEMO else {contract.ENCODING_HEADER: self.encoding}
        answer = None if self.p2p is None else await self.p2p.generate(self, request, headers)
        if answer is None:
            try:
                response, tensors = await self.post_tensors(contract.GENERATE, request, headers=headers)
            except ServerError as exc:
                if exc.status != 409 or exc.error != "no_vocab_mapping" or self.vocab_blob is None:
                    raise
                await self.set_vocab_mapping()
                response, tensors = await self.post_tensors(contract.GENERATE, request, headers=headers)
            answer = response.headers, tensors
        reply_headers, tensors = answer
        sent = reply_headers.get(contract.ENCODING_HEADER, encodings.NEMO)
        if sent != self.encoding:
            raise wire.WireError(f"{self.url}: asked for encoding {self.encoding!r}, the reply is {sent!r}")
        want = encodings.expected(
            self.encoding, batch, seq, self.info.hidden_size, draft_vocab, self._dtype()
        )
        encodings.check(tensors, want)
        return Reply(self.encoding, {k: tensors[k] for k in want})

    async def disconnect(self) -> None:
        """End our session only; the server keeps running for its other clients."""
        await self.post_json(contract.DISCONNECT, b"{}")


def _server_error(url: str, path: str, status: int, payload: bytes) -> ServerError:
    try:
        doc = json.loads(payload)
        error, detail = str(doc.get("error", "")), str(doc.get("detail", ""))
    except (ValueError, AttributeError):
        error, detail = "", bytes(payload[:200]).decode("utf-8", "replace")
    return ServerError(url, path, status, error or f"http_{status}", detail)
