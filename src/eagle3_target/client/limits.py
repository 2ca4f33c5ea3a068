"""How much of a reply the client reads: a limit for every body, checked before it is allocated.

The limit of a /generate reply follows from the batch's shape and the encoding agreed at join, of a
weight from the model's shape; JSON and error bodies are small by nature. A Content-Length over the
limit is refused before a byte is read, a body without one is read up to the limit and no further.
Compressed bodies are refused: the client never asks for them (``new_session``), so one is a fault.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import aiohttp
import torch

from .errors import ReplyTooLarge, ServerFault

JSON_LIMIT = 1 << 20  # /model_info, /init_nccl, /health, heartbeats: a few hundred bytes in practice
ERROR_LIMIT = 64 << 10  # an error body: {"error", "detail"}; read this much, ignore the rest
BLOB_SLACK = 64 << 10  # headers of a blob beyond its tensors' bytes, and small keys we do not ask for
ENTRY_OVERHEAD = 4 + 256 + 3 + 8 * 8 + 8  # key length, a key of up to 256 bytes, flags, 8 dims, nbytes
MAX_ITEMSIZE = 8  # a dtype the server does not name is bounded by the widest one


def blob_limit(want: Mapping[str, tuple[torch.dtype | None, tuple[int, ...]]]) -> int:
    """The most bytes a wire blob of ``want``'s tensors (key -> (dtype or None, shape)) may take."""
    total = 4 + BLOB_SLACK
    for dtype, shape in want.values():
        itemsize = MAX_ITEMSIZE if dtype is None else torch.empty((), dtype=dtype).element_size()
        total += ENTRY_OVERHEAD + math.prod(shape) * itemsize
    return total


def new_session(**kwargs: Any) -> aiohttp.ClientSession:
    """The client's HTTP session: no proxy variables (they must not capture target traffic), no
    Accept-Encoding and no decompression (a compressed body is refused, never inflated)."""
    return aiohttp.ClientSession(
        trust_env=False, auto_decompress=False, skip_auto_headers=("Accept-Encoding",), **kwargs
    )


def check_identity(response: aiohttp.ClientResponse) -> None:
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding != "identity":
        raise ServerFault(f"{response.url}: a {encoding!r}-encoded body, which the client never asks for")


async def read_limited(response: aiohttp.ClientResponse, limit: int, *, truncate: bool = False) -> bytearray:
    """The body, at most ``limit`` bytes. Over the limit: ReplyTooLarge, or with ``truncate`` (error
    bodies) the first ``limit`` bytes, the connection then closed. A declared length is checked before
    anything is allocated; a body that disagrees with its Content-Length is a payload error."""
    if not truncate:
        check_identity(response)
    size = response.content_length
    if size is not None and size <= limit:
        return await _read_sized(response, size)
    if size is not None and not truncate:
        raise ReplyTooLarge(f"{response.url}: Content-Length {size} over the limit of {limit} bytes")
    body = bytearray()
    async for chunk in response.content.iter_any():
        room = limit - len(body)
        if len(chunk) > room:
            if not truncate:
                raise ReplyTooLarge(f"{response.url}: body passed the limit of {limit} bytes")
            body += chunk[:room]
            response.close()  # the rest is never read: this connection cannot be reused
            break
        body += chunk
    return body


async def _read_sized(response: aiohttp.ClientResponse, size: int) -> bytearray:
    """A body of a known (already bounded) size in one buffer: each chunk copied once, never joined."""
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


def parse_json(payload: bytes | bytearray, what: str) -> Any:
    """JSON from a server; anything that does not parse (or nests past Python's stack) is a fault."""
    try:
        return json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise ServerFault(f"{what} is not JSON: {str(exc)[:100]}") from None
