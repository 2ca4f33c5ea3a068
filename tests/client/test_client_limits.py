"""client/limits.py against a real aiohttp server on loopback: the size bound of a wire blob, the session's
settings, and how read_limited and parse_json treat bodies within, at and over their limit."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket

import aiohttp
import pytest
import torch
from aiohttp import web

from eagle3_target.client import limits
from eagle3_target.client.errors import ReplyTooLarge, ServerFault
from eagle3_target.protocol import wire


async def _serve(handler):
    app = web.Application()
    app.router.add_post("/reply", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/reply"


def _replying(
    payload: bytes,
    *,
    chunked: bool = False,
    headers: dict | None = None,
    piece: int = 100,
    pause: float = 0.0,
):
    """A handler that writes ``payload`` in pieces; with a pause after each, the client reads each one apart
    (server and client share the event loop, which the pause hands to the client)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers=headers or {})
        if chunked:
            response.enable_chunked_encoding()
        else:
            response.content_length = len(payload)
        await response.prepare(request)
        for start in range(0, len(payload), piece):  # several chunks, so the limit falls inside one
            await response.write(payload[start : start + piece])
            if pause:
                await asyncio.sleep(pause)
        await response.write_eof()
        return response

    return handler


async def _read(handler, limit: int, **kwargs):
    runner, url = await _serve(handler)
    try:
        async with limits.new_session() as http, http.post(url) as response:
            return await limits.read_limited(response, limit, **kwargs)
    finally:
        await runner.cleanup()


def test_a_blob_limit_counts_each_entry_at_its_widest_and_the_slack_once():
    # 4 (entry count) + 65536 (slack) + 2 entries x 335 (4 + 256 + 3 + 8 * 8 + 8)
    # + 6 float32 (4 bytes each) + 4 elements of an unnamed dtype at the widest, 8 bytes
    want = {"a": (torch.float32, (2, 3)), "b": (None, (4,))}
    assert limits.blob_limit(want) == 4 + 65536 + 2 * 335 + 24 + 32
    assert limits.blob_limit({}) == 4 + 65536


def test_a_blob_limit_holds_the_largest_entry_the_wire_allows():
    """A key of 256 bytes and 8 dimensions: the entry overhead the limit assumes is what the wire writes."""
    tensors = {"k" * 256: torch.zeros((1,) * 8, dtype=torch.float64)}
    want = {key: (value.dtype, tuple(value.shape)) for key, value in tensors.items()}
    assert len(wire.encode(tensors)) <= limits.blob_limit(want) - limits.BLOB_SLACK


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("size", [999, 1000])
async def test_a_body_within_or_at_the_limit_is_read_whole(size, chunked):
    payload = bytes(range(256)) * 4
    got = await _read(_replying(payload[:size], chunked=chunked), 1000)
    assert got == payload[:size]


async def test_a_declared_length_over_the_limit_names_it():
    with pytest.raises(ReplyTooLarge, match=r"/reply: Content-Length 1001 over the limit of 1000 bytes$"):
        await _read(_replying(b"x" * 1001), 1000)


async def test_a_chunked_body_over_the_limit_names_it():
    with pytest.raises(ReplyTooLarge, match=r"/reply: body passed the limit of 1000 bytes$"):
        await _read(_replying(b"x" * 1001, chunked=True), 1000)


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_truncated_read_keeps_the_first_limit_bytes(chunked):
    """Error bodies: what fits is kept, declared length or not, and the rest is not an error."""
    payload = bytes(range(250)) * 8
    assert await _read(_replying(payload, chunked=chunked), 1050, truncate=True) == payload[:1050]


async def test_a_chunked_body_read_in_several_chunks_is_joined_and_bounded_across_them():
    """Without a Content-Length the limit counts every chunk read so far, not only the last one."""
    payload = bytes(range(200)) * 6
    got = await _read(_replying(payload[:800], chunked=True, piece=400, pause=0.05), 1000)
    assert got == payload[:800]
    with pytest.raises(ReplyTooLarge, match=r"/reply: body passed the limit of 1000 bytes$"):
        await _read(_replying(payload, chunked=True, piece=600, pause=0.05), 1000)
    truncated = await _read(_replying(payload, chunked=True, piece=600, pause=0.05), 1000, truncate=True)
    assert truncated == payload[:1000]


async def test_a_compressed_body_is_refused_unless_truncated():
    compressed = gzip.compress(b"{}")
    handler = _replying(compressed, headers={"Content-Encoding": " GZip "})
    with pytest.raises(ServerFault, match=r"/reply: a 'gzip'-encoded body, which the client never asks for"):
        await _read(handler, 1000)
    # an error body is read as it came, never inflated
    assert await _read(handler, 1000, truncate=True) == compressed


async def test_an_identity_encoding_in_any_case_is_accepted():
    handler = _replying(b"{}", headers={"Content-Encoding": " Identity "})
    assert await _read(handler, 1000) == b"{}"


async def test_the_session_asks_for_no_encoding_inflates_nothing_and_ignores_proxy_variables(monkeypatch):
    seen = {}
    compressed = gzip.compress(b"x" * 1000)

    async def handler(request: web.Request) -> web.Response:
        seen["accept"] = request.headers.get("Accept-Encoding")
        return web.Response(body=compressed, headers={"Content-Encoding": "gzip"})

    with socket.socket() as dead:  # a proxy that refuses every connection
        dead.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{dead.getsockname()[1]}"
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, proxy)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    runner, url = await _serve(handler)
    try:
        async with limits.new_session() as http, http.post(url) as response:
            assert await response.read() == compressed
    finally:
        await runner.cleanup()
    assert seen["accept"] is None


async def test_the_session_keeps_the_callers_settings():
    """The pool passes its own connector (no cap on connections per server); a caller's headers are sent."""
    seen = {}

    async def handler(request: web.Request) -> web.Response:
        seen["header"] = request.headers.get("X-Caller")
        return web.Response(body=b"{}")

    connector = aiohttp.TCPConnector(limit=0)
    runner, url = await _serve(handler)
    try:
        async with limits.new_session(connector=connector, headers={"X-Caller": "pool"}) as http:
            assert http.connector is connector
            async with http.post(url) as response:
                assert await response.read() == b"{}"
    finally:
        await runner.cleanup()
    assert seen["header"] == "pool"


def test_json_is_parsed():
    assert limits.parse_json(b'{"a": [1, 2]}', "x") == {"a": [1, 2]}


@pytest.mark.parametrize(
    "payload", [b"{" + b'"a' * 200, b"[" * 100_000 + b"]" * 100_000], ids=["broken", "nested"]
)
def test_a_body_that_is_not_json_is_one_fault_naming_its_source(payload):
    with pytest.raises(ServerFault) as caught:
        limits.parse_json(payload, "/model_info")
    message = str(caught.value)
    assert message.startswith("/model_info is not JSON: ")
    try:
        json.loads(payload)
    except (ValueError, RecursionError) as exc:
        assert message == f"/model_info is not JSON: {str(exc)[:100]}"
