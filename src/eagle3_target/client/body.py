"""Reading a wire-blob response body into tensors as it arrives (``wire.read_blob`` over aiohttp).

aiohttp's HTTP parser copies every body chunk into a new bytes object, which the reader would then
copy again into the tensor. For a large body on a plain TCP connection the socket is read directly:
once the bytes aiohttp has already buffered are used up, the transport is handed to a
``BufferedProtocol`` whose buffer is the destination tensor's memory, so the kernel copies into the
tensor (``recv_into``) and nothing else touches the bytes. aiohttp's parser never sees the rest of
the body, so that connection is closed afterwards instead of being reused: one new connection per
large reply, against hundreds of megabytes moved on it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from eagle3_target.protocol import wire

from .errors import ReplyTooLarge
from .limits import check_identity, read_limited

DIRECT_MIN_BYTES = 16 << 20  # smaller bodies go through aiohttp's parser and keep their connection


class _BufferedBody:
    """A wire.ByteSource over aiohttp's received body chunks: each copied once, into its final place."""

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


class _Receiver(asyncio.BufferedProtocol):
    """Receives into one destination view at a time; reading is paused while there is none."""

    def __init__(self, transport: asyncio.Transport):
        self.transport = transport
        self.view = memoryview(b"")
        self.filled = 0
        self.done: asyncio.Future | None = None
        self.error: BaseException | None = None

    def fill(self, view: memoryview) -> asyncio.Future:
        self.view, self.filled = view, 0
        self.done = asyncio.get_running_loop().create_future()
        if self.error is not None:
            self.done.set_exception(self.error)
        else:
            self.transport.resume_reading()
        return self.done

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        if self.filled == len(self.view):
            self.transport.pause_reading()
            self.done.set_result(None)

    def eof_received(self) -> bool:
        self._fail(aiohttp.ClientPayloadError("the server closed the connection mid-body"))
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self._fail(aiohttp.ClientPayloadError(f"connection lost mid-body: {exc or 'closed'}"))

    def _fail(self, error: BaseException) -> None:
        self.error = self.error or error
        if self.done is not None and not self.done.done():
            self.done.set_exception(self.error)


class _SocketBody(_BufferedBody):
    """What aiohttp has buffered first, then straight from the socket (see the module's docstring)."""

    def __init__(self, response: aiohttp.ClientResponse, stall_timeout: float | None):
        super().__init__(response)
        self.response = response
        self.stall_timeout = stall_timeout
        self.receiver: _Receiver | None = None

    async def readinto(self, view: memoryview) -> None:
        filled = 0
        while self.receiver is None and filled < len(view):
            chunk = self.content.read_nowait(len(view) - filled)
            if not chunk:  # aiohttp holds no more: from here on, the socket is ours
                self._take_over()
                break
            view[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
        if filled < len(view):
            async with asyncio.timeout(self.stall_timeout):
                await self.receiver.fill(view[filled:])

    def _take_over(self) -> None:
        transport = self.response.connection.transport
        self.original = transport.get_protocol()
        self.receiver = _Receiver(transport)
        transport.set_protocol(self.receiver)
        transport.pause_reading()

    def close(self) -> None:
        """Give the transport back to aiohttp and close it: its parser is mid-body for good."""
        if self.receiver is not None:
            self.receiver.transport.set_protocol(self.original)
            self.response.close()


def _direct(response: aiohttp.ClientResponse) -> bool:
    connection = response.connection
    if connection is None or connection.transport is None:
        return False
    plain_tcp = connection.transport.get_extra_info("sslcontext") is None
    return plain_tcp and response.content_length >= DIRECT_MIN_BYTES and response.content.exception() is None


async def read_tensors(
    response: aiohttp.ClientResponse, limit: int, pin_memory: bool = False, stall_timeout: float | None = None
) -> dict[str, Any]:
    """A wire-blob body of at most ``limit`` bytes as tensors, each read into its own storage as it
    arrives (wire.read_blob). ``stall_timeout``: seconds a direct socket read may wait for the next bytes.
    A body over the limit is refused before anything is allocated for it."""
    check_identity(response)
    size = response.content_length
    if size is None:  # chunked or close-delimited: no length to bound the allocations by, so the body first
        return wire.decode(await read_limited(response, limit))
    if size > limit:
        raise ReplyTooLarge(f"{response.url}: Content-Length {size} over the limit of {limit} bytes")
    if not _direct(response):
        return await wire.read_blob(_BufferedBody(response), size, pin_memory=pin_memory)
    source = _SocketBody(response, stall_timeout)
    try:
        return await wire.read_blob(source, size, pin_memory=pin_memory)
    finally:
        source.close()
