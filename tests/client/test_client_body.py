"""read_tensors against a real aiohttp server on loopback: large bodies straight from the socket, small ones
through aiohttp's parser, and what a server that hangs up or stalls mid-body does to each."""

from __future__ import annotations

import asyncio
import gzip
import socket
import ssl
import struct

import aiohttp
import pytest
import torch
from aiohttp import web

from eagle3_target.client import body, limits
from eagle3_target.client.connection import ServerConnection
from eagle3_target.client.errors import ReplyTooLarge, ServerFault
from eagle3_target.protocol import wire

from .hostile_server import self_signed

LIMIT = 1 << 30

BIG = {
    "probs": torch.rand(5, 1 << 20),
    "ids": torch.arange(10),
    "none": None,
    "aux": torch.randn(1000).bfloat16(),
}
SMALL = {"ids": torch.arange(1000)}


async def _serve(handler, ssl_context: ssl.SSLContext | None = None):
    app = web.Application()
    app.router.add_post("/reply", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    scheme = "https" if ssl_context else "http"
    return runner, f"{scheme}://127.0.0.1:{runner.addresses[0][1]}/reply"


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


def _sized(nbytes: int) -> dict:
    """Tensors whose wire blob is exactly ``nbytes`` long (the padding's length is found by trying)."""
    pad = nbytes
    for _ in range(4):
        tensors = {
            "probs": torch.rand(3, 1 << 18),
            "ids": torch.arange(1000),
            "pad": torch.ones(pad, dtype=torch.uint8),
        }
        pad += nbytes - wire.EncodedBlob(tensors).nbytes
    assert wire.EncodedBlob(tensors).nbytes == nbytes
    return tensors


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


@pytest.mark.parametrize(
    "nbytes, new_connections", [(body.DIRECT_MIN_BYTES - 1, 1), (body.DIRECT_MIN_BYTES, 2)]
)
async def test_only_bodies_of_the_direct_minimum_or_more_are_read_from_the_socket(nbytes, new_connections):
    """Just under the threshold the body goes through aiohttp's parser in the pieces it arrives in (1 MiB
    writes) and the connection is reused; at the threshold it is read from the socket and closed after."""
    tensors, peers = _sized(nbytes), []
    runner, url = await _serve(_replying(tensors, peers))
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                async with http.post(url) as response:
                    _same(await body.read_tensors(response, LIMIT), tensors)
    finally:
        await runner.cleanup()
    assert len(set(peers)) == new_connections


def _on_cue(cue: asyncio.Event, then=None):
    """A handler that sends BIG's headers, waits for ``cue``, then ``then(request)`` or the whole body."""
    blob = wire.EncodedBlob(BIG)

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = blob.nbytes
        await response.prepare(request)
        await cue.wait()
        if then is not None:
            then(request)
            return response
        for chunk in blob.chunks(1 << 20):
            await response.write(chunk)
        return response

    return handler


async def _reading_from_the_socket(response: aiohttp.ClientResponse) -> asyncio.Task:
    """read_tensors started as a task, once it has taken the socket over from aiohttp's parser."""
    transport = response.connection.transport
    reading = asyncio.create_task(body.read_tensors(response, LIMIT))
    while not isinstance(transport.get_protocol(), body._Receiver):
        await asyncio.sleep(0)
    return reading


async def test_a_direct_read_gives_the_connection_back_to_aiohttp_and_closes_it():
    cue = asyncio.Event()
    runner, url = await _serve(_on_cue(cue))
    try:
        async with aiohttp.ClientSession() as http, http.post(url) as response:
            closed = response.connection.protocol.closed  # set by aiohttp's protocol's connection_lost
            reading = await _reading_from_the_socket(response)
            cue.set()
            _same(await reading, BIG)
            async with asyncio.timeout(60):  # a failure bound, not a speed goal: never set when it fails
                await closed
    finally:
        cue.set()
        await runner.cleanup()


def _reset(request: web.Request) -> None:
    """Close the server's socket with an RST (SO_LINGER 0) instead of a FIN."""
    request.transport.get_extra_info("socket").setsockopt(
        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
    )
    request.transport.abort()


async def test_a_connection_reset_under_a_direct_read_is_a_payload_error_naming_it():
    cue = asyncio.Event()
    runner, url = await _serve(_on_cue(cue, then=_reset))
    try:
        async with aiohttp.ClientSession() as http, http.post(url) as response:
            reading = await _reading_from_the_socket(response)
            cue.set()
            with pytest.raises(aiohttp.ClientPayloadError, match="connection lost mid-body: .*reset"):
                await reading
    finally:
        cue.set()
        await runner.cleanup()


async def test_closing_the_response_under_a_direct_read_ends_it_with_a_payload_error():
    """Not a wait for the stall timeout (there is none here): the read learns its connection is gone."""
    cue = asyncio.Event()
    runner, url = await _serve(_on_cue(cue))
    try:
        async with aiohttp.ClientSession() as http, http.post(url) as response:
            reading = await _reading_from_the_socket(response)
            response.close()
            with pytest.raises(aiohttp.ClientPayloadError, match="connection lost mid-body: closed$"):
                await reading
    finally:
        cue.set()
        await runner.cleanup()


async def test_a_small_body_arriving_after_its_headers_keeps_its_connection():
    """Nothing of the body is buffered when reading starts, which must not send a small body to the
    socket path (it would close the connection)."""
    cue, peers = asyncio.Event(), []
    blob = wire.encode(SMALL)

    async def handler(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername"))
        response = web.StreamResponse()
        response.content_length = len(blob)
        await response.prepare(request)
        await cue.wait()
        await response.write(blob)
        return response

    runner, url = await _serve(handler)
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                cue.clear()
                async with http.post(url) as response:
                    reading = asyncio.create_task(body.read_tensors(response, LIMIT))
                    cue.set()
                    _same(await reading, SMALL)
    finally:
        cue.set()
        await runner.cleanup()
    assert len(set(peers)) == 1


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A self-signed certificate for 127.0.0.1: the server's context and a client's that trusts it."""
    cert, server = self_signed(tmp_path_factory.mktemp("tls"))
    return server, ssl.create_default_context(cafile=cert)


async def test_a_large_body_over_tls_goes_through_aiohttps_parser_and_keeps_its_connection(tls):
    """The socket is read directly only on plain TCP: under TLS it carries ciphertext."""
    peers: list = []
    runner, url = await _serve(_replying(BIG, peers), ssl_context=tls[0])
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls[1])) as http:
            for _ in range(2):
                async with http.post(url) as response:
                    _same(await body.read_tensors(response, LIMIT), BIG)
    finally:
        await runner.cleanup()
    assert len(set(peers)) == 1


async def test_received_tensors_are_writable_and_independent():
    runner, url = await _serve(_replying(BIG, []))
    try:
        async with aiohttp.ClientSession() as http, http.post(url) as response:
            got = await body.read_tensors(response, LIMIT)
    finally:
        await runner.cleanup()
    got["probs"][0, 0] = -1.0
    assert BIG["probs"][0, 0] >= 0 and got["ids"].tolist() == list(range(10))


@pytest.mark.parametrize(
    "tensors, message",
    [(BIG, "^the server closed the connection mid-body$"), ({"ids": torch.arange(1 << 16)}, "not completed")],
)
async def test_a_server_hanging_up_mid_body_is_a_payload_error(tensors, message):
    runner, url = await _serve(_replying(tensors, [], cut_after=1 << 19 if tensors is BIG else 1))
    try:
        async with aiohttp.ClientSession() as http, http.post(url) as response:
            with pytest.raises(aiohttp.ClientPayloadError, match=message):
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


def _chunked(tensors):
    """A handler sending ``tensors`` chunked: no Content-Length to size anything by."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for chunk in wire.EncodedBlob(tensors).chunks(1 << 16):
            await response.write(chunk)
        await response.write_eof()
        return response

    return handler


@pytest.mark.parametrize("limit", [LIMIT, 1000])
async def test_a_chunked_body_is_read_whole_within_the_limit(limit):
    runner, url = await _serve(_chunked(SMALL))
    try:
        async with aiohttp.ClientSession() as http, http.post(url) as response:
            assert response.content_length is None
            if limit < len(wire.encode(SMALL)):
                with pytest.raises(ReplyTooLarge, match="body passed the limit of 1000 bytes"):
                    await body.read_tensors(response, limit)
            else:
                _same(await body.read_tensors(response, limit), SMALL)
    finally:
        await runner.cleanup()


async def test_a_declared_length_at_the_limit_is_read():
    blob = wire.encode(SMALL)

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=blob)

    runner, url = await _serve(handler)
    try:
        async with aiohttp.ClientSession() as http, http.post(url) as response:
            _same(await body.read_tensors(response, len(blob)), SMALL)
    finally:
        await runner.cleanup()
