"""Send a response body from tensor storage to the client's socket with no copy in user space.

On Python 3.11, asyncio's selector transport copies into a bytearray of its own every byte that
send() does not take at once (3.12 keeps a view instead, CPython gh-91166). So once aiohttp has written the response head, the body goes out
through a duplicate of the connection's socket with ``loop.sock_sendall``, which sends from the
memoryview it is given and waits for writability itself. The duplicate is needed because asyncio
refuses to watch a file descriptor that a transport owns; both refer to one socket.

Only for plain TCP transports (the server never speaks TLS itself: see process.py).
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterable


async def send_body(
    transport: asyncio.Transport | None, chunks: Iterable[bytes | memoryview], stall: float
) -> None:
    """Send ``chunks`` in order after what the transport already holds; TimeoutError if one stalls."""
    if transport is None or transport.is_closing():  # the client left while the reply was computed
        raise ConnectionResetError("the connection closed before the body")
    loop = asyncio.get_running_loop()
    with socket.socket(fileno=os.dup(transport.get_extra_info("socket").fileno())) as sock:
        sock.setblocking(False)
        async with asyncio.timeout(stall):
            await _flushed(loop, sock, transport)
        for chunk in chunks:
            if transport.is_closing():
                raise ConnectionResetError("the connection closed mid-response")
            async with asyncio.timeout(stall):
                await loop.sock_sendall(sock, chunk)


async def _flushed(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, transport: asyncio.Transport
) -> None:
    """Wait until the transport has handed all it holds (the response head) to the kernel.

    The transport writes its buffer out when the socket turns writable, so waiting for that
    (at most a few times) is waiting for the transport.
    """
    while transport.get_write_buffer_size():
        if transport.is_closing():
            raise ConnectionResetError("the connection closed mid-response")
        writable = loop.create_future()
        loop.add_writer(sock, _settle, writable)
        try:
            await writable
        finally:
            loop.remove_writer(sock)


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
