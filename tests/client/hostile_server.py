"""A hostile target server for client tests: a raw-asyncio HTTP proxy in front of a real one.

Every request is forwarded to the real (synthetic) server; a rule for a path may replace what
comes back with anything a buggy server, a misbehaving proxy or an attacker sends: lies in
Content-Length, bad framing, endless or compressed bodies, wire blobs whose headers lie, other
requests' replies, another model. Raw sockets, so a reply can carry bytes no HTTP library writes.
The proxy runs on its own event-loop thread; the trainer under test runs in another process
(trainer_worker.py) so that its peak memory is its own.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
import struct
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from eagle3_target.protocol import wire


@dataclass
class Message:
    """One HTTP request or response, whole (the real server always sends a Content-Length)."""

    start: str  # request line or status line
    headers: dict[str, str]
    body: bytes = b""

    @property
    def status(self) -> int:
        return int(self.start.split(" ", 2)[1])

    def header(self, name: str, default: str | None = None) -> str | None:
        return next((v for k, v in self.headers.items() if k.lower() == name.lower()), default)

    def encode(self, *, content_length: int | None = None) -> bytes:
        """The message as sent, with an honest Content-Length unless one is given."""
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("content-length", "connection")}
        headers["Content-Length"] = str(len(self.body) if content_length is None else content_length)
        head = self.start + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        return head.encode("latin-1") + self.body


Writer = Callable[[asyncio.StreamWriter], Awaitable[None]]  # writes a whole answer itself
Action = bytes | Writer | None  # raw bytes to send; a writer; None: the honest reply
Rule = Callable[[Message, Callable[[], Awaitable[Message]]], Awaitable[Action]]


def response(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> Message:
    reason = {200: "OK", 400: "Bad Request", 409: "Conflict", 429: "Too Many Requests", 503: "Unavailable"}
    return Message(f"HTTP/1.1 {status} {reason.get(status, 'X')}", dict(headers or {}), body)


def json_response(status: int, doc, headers: dict[str, str] | None = None) -> Message:
    return response(status, json.dumps(doc).encode(), {"Content-Type": "application/json", **(headers or {})})


@dataclass
class HostileProxy:
    upstream: str
    rules: dict[str, Rule] = field(default_factory=dict)  # path without "/" -> rule
    seen: dict[str, int] = field(default_factory=dict)  # requests per path
    tls: ssl.SSLContext | None = None  # set: the proxy speaks https (a TLS front of a plain server)

    def start(self) -> str:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls), self.loop
        ).result(10)
        scheme = "http" if self.tls is None else "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self.url

    def close(self) -> None:
        async def stop():
            self.server.close()
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await _read_message(reader, has_body=True)
                if request is None:
                    return
                path = request.start.split(" ")[1].lstrip("/")
                self.seen[path] = self.seen.get(path, 0) + 1
                rule = self.rules.get(path)
                action = None if rule is None else await rule(request, lambda r=request: self._forward(r))
                if action is None:
                    writer.write((await self._forward(request)).encode())
                elif isinstance(action, bytes):
                    writer.write(action)
                else:
                    await action(writer)
                    return
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _forward(self, request: Message) -> Message:
        host = urlsplit(self.upstream)
        reader, writer = await asyncio.open_connection(host.hostname, host.port)
        try:
            writer.write(request.encode())
            await writer.drain()
            answer = await _read_message(reader, has_body=True)
        finally:
            writer.close()
        assert answer is not None
        return answer


async def _read_message(reader: asyncio.StreamReader, has_body: bool) -> Message | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    start, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines if ": " in line)
    message = Message(start, headers)
    length = int(message.header("Content-Length", "0"))
    if has_body and length:
        message.body = await reader.readexactly(length)
    return message


# -- building blocks for rules ---------------------------------------------------------------


def always(action: Action) -> Rule:
    async def rule(request: Message, forward) -> Action:
        return action

    return rule


def mangle(edit: Callable[[Message], Message | bytes]) -> Rule:
    """The real reply, edited."""

    async def rule(request: Message, forward) -> Action:
        answer = edit(await forward())
        return answer if isinstance(answer, bytes) else answer.encode()

    return rule


def declared(status: int, length: int, sent: bytes = b"") -> Writer:
    """A reply that declares ``length`` bytes, sends ``sent`` and hangs up."""

    async def write(writer: asyncio.StreamWriter) -> None:
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Length: {length}\r\n\r\n".encode() + sent)
        await writer.drain()

    return write


def endless(
    status: int = 200, chunked: bool = True, chunk: bytes = b"x" * 65536, limit: int = 2 << 30
) -> Writer:
    """A body that goes on (up to ``limit`` bytes, or until the client hangs up), chunked or close-delimited."""

    async def write(writer: asyncio.StreamWriter) -> None:
        framing = "Transfer-Encoding: chunked\r\n" if chunked else "Connection: close\r\n"
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n{framing}\r\n".encode())
        sent = 0
        while sent < limit:
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            await writer.drain()
            sent += len(chunk)

    return write


def edit_blob(edit: Callable[[dict], dict]) -> Callable[[Message], Message]:
    """Decode the real wire reply, edit its tensors, encode it again (headers kept)."""

    def apply(answer: Message) -> Message:
        tensors = dict(wire.decode(bytearray(answer.body)))
        answer.body = wire.encode(edit(tensors))
        return answer

    return apply


def entry(key: bytes, code: int, shape: list[int], nbytes: int) -> bytes:
    """A wire entry header (no data) that says whatever a test wants it to."""
    return (
        struct.pack("<I", len(key))
        + key
        + bytes([0, code, len(shape)])
        + struct.pack(f"<{len(shape)}q", *shape)
        + struct.pack("<Q", nbytes)
    )


def self_signed(directory) -> tuple[str, ssl.SSLContext]:
    """A certificate for 127.0.0.1 (its PEM path, for SSL_CERT_FILE) and a server context serving it."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_path, key_path)
    return str(cert_path), context
