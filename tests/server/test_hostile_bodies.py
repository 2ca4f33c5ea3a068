"""Request bodies that lie, stall or stop halfway, against a real server process: each is answered (or
dropped) within --body-timeout, a declared size over --max-body-bytes is refused before any of it is
read, and a client that hangs up mid-body costs the log one INFO line, never a traceback."""

import json
import socket
import time

import pytest
from hostile_support import ServerProcess

from eagle3_target.protocol import contract

BODY_TIMEOUT = 1.0
MAX_BODY = 1 << 20


@pytest.fixture(scope="module")
def srv():
    with ServerProcess(dict(vocab_size=64), body_timeout=BODY_TIMEOUT, max_body_bytes=MAX_BODY) as server:
        yield server


def send_head(srv: ServerProcess, length: int, body: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", srv.port))
    head = f"POST /{contract.GENERATE} HTTP/1.1\r\nHost: t\r\nContent-Length: {length}\r\n\r\n"
    sock.sendall(head.encode() + body)
    return sock


def reply_of(sock: socket.socket, timeout: float) -> tuple[int, dict, float]:
    """The status and JSON body of the one reply, and how long it took to arrive. Read up to its
    Content-Length, not to EOF: aiohttp then lingers (up to 10 s) reading what the client still sends."""
    start = time.monotonic()
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < length_of(data):
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"Connection: close" in head, head  # an unread body: the connection carries nothing more
    return int(head.split()[1]), json.loads(body), time.monotonic() - start


def length_of(data: bytes) -> int:
    head = data.partition(b"\r\n\r\n")[0].decode("latin-1")
    return next(
        int(line.split(":")[1]) for line in head.split("\r\n") if line.lower().startswith("content-length")
    )


def test_a_body_shorter_than_its_content_length_gets_408_within_the_body_timeout(srv):
    status, doc, took = reply_of(send_head(srv, 1000, b"abc"), timeout=10 * BODY_TIMEOUT + 10)
    assert (status, doc["error"]) == (408, "body_timeout"), doc
    assert "--body-timeout" in doc["detail"]
    assert took < BODY_TIMEOUT + 5


def test_a_declared_length_over_the_limit_gets_413_before_any_body_is_sent(srv):
    status, doc, took = reply_of(send_head(srv, 99_999_999_999), timeout=BODY_TIMEOUT / 2 + 5)
    assert (status, doc["error"]) == (413, "request_entity_too_large"), doc
    assert "99999999999" in doc["detail"] and "--max-body-bytes" in doc["detail"]


def test_a_client_that_hangs_up_mid_body_costs_one_info_line_and_no_traceback(srv):
    before = srv.logs()
    for _ in range(3):
        send_head(srv, 1000, b"abc").close()
    deadline = time.monotonic() + 20
    while srv.logs().count("hung up mid-request") - before.count("hung up mid-request") < 3:
        assert time.monotonic() < deadline, srv.logs()
        time.sleep(0.05)
    srv.wait_ready()  # still serving
    new = srv.logs()[len(before) :]
    assert "Traceback" not in new and "ERROR" not in new, new
    lines = [line for line in new.splitlines() if "hung up" in line]
    assert len(lines) == 3 and all(line.startswith("INFO ") for line in lines), new
