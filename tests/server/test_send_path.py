"""The server's send path: tensor storage goes to the socket, never through asyncio's write buffer."""

import asyncio
import socket
from asyncio import selector_events

import pytest
import torch
from target_support import generate_body, serve, vocab_body

from eagle3_target.protocol import wire
from eagle3_target.server.runners.synthetic import SyntheticRunner
from eagle3_target.server.send import send_body

V = 512
HEAD = 1 << 10  # the response head and the blob's magic: all that goes through the transport


class TransportWrites:
    """Counts the bytes given to the selector transport's real write (stdlib, not ours).

    On Python 3.11 whatever send() does not take at once is copied into the transport's own
    bytearray, so bytes that never reach transport.write can never be copied there.
    """

    def __init__(self, monkeypatch, server_port: int):
        self.bytes = self.max_buffered = 0
        real_write = selector_events._SelectorSocketTransport.write

        def write(transport, data):
            real_write(transport, data)
            if transport.get_extra_info("sockname")[1] != server_port:
                return  # the test's own client
            self.bytes += len(data)
            self.max_buffered = max(self.max_buffered, transport.get_write_buffer_size())

        monkeypatch.setattr(selector_events._SelectorSocketTransport, "write", write)


async def _exchange(reader, writer, request: bytes, pause: float) -> bytes:
    """One request on an open connection; reads its reply 64 KiB at a time, pausing between reads."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))[15:])
    body = bytearray()
    while len(body) < length:
        body += await reader.read(min(1 << 16, length - len(body)))
        await asyncio.sleep(pause)
    return bytes(body)


async def _connect(url: str, rcvbuf: int):
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((host, int(port)))
    return await asyncio.open_connection(sock=sock)


async def _served_reply(srv, big: bytes) -> bytes:
    await srv.post("set_vocab_mapping", vocab_body(torch.arange(100), torch.arange(V) < 100))
    async with srv.http.post(f"{srv.url}/generate", data=big) as resp:
        return await resp.read()


async def test_no_byte_of_tensor_storage_passes_through_asyncios_buffer_for_slow_or_fast_readers(monkeypatch):
    async with serve(lambda: SyntheticRunner(vocab_size=V, hidden_size=2048)) as srv:
        big = generate_body(torch.zeros(4, 1024, dtype=torch.long))  # ~50 MB of supervision
        expected = await _served_reply(srv, big)
        writes = TransportWrites(monkeypatch, int(srv.url.rsplit(":", 1)[1]))
        request = f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: {len(big)}\r\n\r\n".encode() + big
        # A trainer busy elsewhere (small receive buffer, pauses), then one that reads at full
        # speed on the same kept-alive connection: the second reply follows the first intact.
        reader, writer = await _connect(srv.url, rcvbuf=1 << 16)
        slow = await _exchange(reader, writer, request, pause=0.001)
        fast = await _exchange(reader, writer, request, pause=0)
        writer.close()
    assert slow == fast == expected  # byte for byte what an ordinary client gets
    assert wire.decode(bytearray(slow))["aux_hidden_states"].shape[:2] == (4, 1024)
    assert len(slow) > 40e6
    assert 0 < writes.bytes <= 2 * HEAD, writes.bytes  # only the two heads went to the transport
    assert writes.max_buffered <= HEAD, writes.max_buffered


async def test_a_connection_gone_before_the_body_is_a_connection_error_not_a_crash():
    """The handler maps ConnectionError to 499; anything else (a closed fd's EBADF) would be a 500."""
    accepted = asyncio.get_running_loop().create_future()
    server = await asyncio.start_server(lambda r, w: accepted.set_result(w), "127.0.0.1", 0)
    async with server:
        _, client = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        served = await accepted
        served.transport.abort()
        await asyncio.sleep(0)  # the transport lets go of its socket on the next loop turn
        for transport in (served.transport, None):
            with pytest.raises(ConnectionResetError):
                await send_body(transport, [b"body"], stall=1.0)
        client.close()
