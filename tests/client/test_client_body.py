"""read_tensors against a real aiohttp server on loopback: large bodies straight from the socket, small ones
through aiohttp's parser, and what a server that hangs up or stalls mid-body does to each."""

from __future__ import annotations

import asyncio
import gzip

import aiohttp
import pytest
import torch
from aiohttp import web

from eagle3_target.client import body, limits
from eagle3_target.client.connection import ServerConnection
from eagle3_target.client.errors import ReplyTooLarge, ServerFault
from eagle3_target.protocol import wire

LIMIT = 1 << 30

BIG = {
    "probs": torch.rand(5, 1 << 20),
    "ids": torch.arange(10),
    "none": None,
    "aux": torch.randn(1000).bfloat16(),
}
SMALL = {"ids": torch.arange(1000)}


async def _serve(handler):
    app = web.Application()
    app.router.add_post("/reply", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/reply"


def _replying(tensors, peers: list, cut_after: int | None = None, stall: bool = False):
    """A handler streaming ``tensors`` as a wire blob; it can hang up or go silent after ``cut_after`` bytes."""

    async def handler(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername"))
        blob = wire.EncodedBlob(tensors)
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = blob.nbytes
        await response.prepare(request)
        sent = 0
        for chunk in blob.chunks(1 << 20):
            if cut_after is not None and sent >= cut_after:
                if stall:
                    await asyncio.sleep(3)  # past the client's 1 s stall timeout
                request.transport.close()
                return response
            await response.write(chunk)
            sent += len(chunk)
        await response.write_eof()
        return response

    return handler


def _same(got, sent) -> None:
    assert list(got) == list(sent)
    for key, value in sent.items():
        assert (got[key] is None) if value is None else torch.equal(got[key], value)


@pytest.mark.parametrize("tensors, new_connections", [(BIG, 2), (SMALL, 1)])
async def test_bodies_arrive_whole_and_only_large_ones_close_their_connection(tensors, new_connections):
    peers: list = []
    runner, url = await _serve(_replying(tensors, peers))
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                async with http.post(url) as response:
                    direct = response.content_length >= body.DIRECT_MIN_BYTES
                    _same(await body.read_tensors(response, LIMIT), tensors)
    finally:
        await runner.cleanup()
    assert direct == (tensors is BIG)
    assert len(set(peers)) == new_connections  # a reused connection has the same client port


async def test_received_tensors_are_writable_and_independent():
    runner, url = await _serve(_replying(BIG, []))
    try:
        async with aiohttp.ClientSession() as http, http.post(url) as response:
            got = await body.read_tensors(response, LIMIT)
    finally:
        await runner.cleanup()
    got["probs"][0, 0] = -1.0
    assert BIG["probs"][0, 0] >= 0 and got["ids"].tolist() == list(range(10))


@pytest.mark.parametrize("tensors", [BIG, {"ids": torch.arange(1 << 16)}])
async def test_a_server_hanging_up_mid_body_is_a_payload_error(tensors):
    runner, url = await _serve(_replying(tensors, [], cut_after=1 << 19 if tensors is BIG else 1))
    try:
        async with aiohttp.ClientSession() as http, http.post(url) as response:
            with pytest.raises(aiohttp.ClientPayloadError):
                await body.read_tensors(response, LIMIT)
    finally:
        await runner.cleanup()


async def test_a_stalled_direct_read_times_out():
    runner, url = await _serve(_replying(BIG, [], cut_after=4 << 20, stall=True))
    try:
        async with aiohttp.ClientSession() as http, http.post(url) as response:
            with pytest.raises(TimeoutError):
                await body.read_tensors(response, LIMIT, stall_timeout=1.0)
    finally:
        await runner.cleanup()


async def test_request_timeout_bounds_a_paced_direct_read():
    """A 20 MiB reply of 60 tensors trickled in 64 KiB pieces, each tensor well inside the stall timeout:
    the direct (recv_into) path still ends the attempt at request_timeout (before: the whole deadline)."""

    blob = wire.encode({f"t{i}": torch.zeros(85_000) for i in range(60)})

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = len(blob)
        await response.prepare(request)
        for start in range(0, len(blob), 64 << 10):
            await response.write(blob[start : start + (64 << 10)])
            await asyncio.sleep(0.1)
        return response

    runner, url = await _serve(handler)
    try:
        async with limits.new_session() as http:
            conn = ServerConnection(url.rsplit("/", 1)[0], http, "session", timeout=2.0)
            async with asyncio.timeout(20):  # the trickle alone would take 32 s
                with pytest.raises(TimeoutError):
                    await conn.post_tensors("reply", limit=LIMIT)
    finally:
        await runner.cleanup()


async def test_a_compressed_body_is_refused_not_inflated():
    """The client's session asks for no encoding and decompresses nothing: a gzip body is a server fault
    (a 1 MB gzip bomb cost 3.3 GB when aiohttp inflated it)."""
    seen = {}

    async def handler(request: web.Request) -> web.Response:
        seen["accept"] = request.headers.get("Accept-Encoding")
        compressed = gzip.compress(wire.encode(BIG), compresslevel=1)
        return web.Response(body=compressed, headers={"Content-Encoding": "gzip"})

    runner, url = await _serve(handler)
    try:
        async with limits.new_session() as http, http.post(url) as response:
            with pytest.raises(ServerFault, match="'gzip'-encoded body"):
                await body.read_tensors(response, LIMIT)
        assert seen["accept"] is None
    finally:
        await runner.cleanup()


async def test_a_declared_length_over_the_limit_is_refused_before_reading():
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=wire.encode(BIG))

    runner, url = await _serve(handler)
    try:
        async with aiohttp.ClientSession() as http, http.post(url) as response:
            with pytest.raises(ReplyTooLarge, match="over the limit of 1000 bytes"):
                await body.read_tensors(response, 1000)
    finally:
        await runner.cleanup()
