"""A hostile client for target servers: seeded fuzz cases, raw HTTP, and a server in its own process.

Shared by tests/server/ and bench/hostile_client.py. Requests go over raw sockets so a case can
carry anything a broken or hostile client sends: bytes no HTTP library would put in a header, a
Content-Encoding that does not match the body, blobs whose headers lie about their shapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch
from target_support import free_port

from eagle3_target.protocol import contract, wire

ENDPOINTS = [
    contract.HEALTH,
    contract.READYZ,
    contract.LIVEZ,
    contract.METRICS,
    contract.HEARTBEAT,
    contract.MODEL_INFO,
    contract.INPUT_EMBEDDINGS,
    contract.SET_VOCAB_MAPPING,
    contract.INIT_NCCL,
    contract.GENERATE,
    contract.DISCONNECT,
    "nope",
    "generate/",
]
METHODS = ["POST"] * 6 + ["GET", "PUT", "DELETE", "PATCH", "OPTIONS"]


@dataclass
class Case:
    method: str
    path: str
    headers: list[tuple[bytes, bytes]]
    body: bytes


class CaseGenerator:
    """Requests a broken or hostile client sends, from a seed: same seed, same cases."""

    def __init__(self, seed: int, vocab: int, token: str | None = None):
        self.rng = random.Random(seed)
        self.vocab = vocab
        self.token = token

    def cases(self, n: int):
        for _ in range(n):
            yield self.case()

    def case(self) -> Case:
        r = self.rng
        path = r.choice(ENDPOINTS)
        method = (
            "GET" if path in (contract.HEALTH, contract.READYZ, contract.LIVEZ, contract.METRICS) else "POST"
        )
        if r.random() < 0.1:
            method = r.choice(METHODS)
        body = self.body(path)
        headers = []
        if self.token and r.random() < 0.9:
            headers.append((b"Authorization", f"Bearer {self.token}".encode()))
        elif r.random() < 0.5:
            headers.append((b"Authorization", b"Bearer " + self.header_bytes(r.randint(0, 40))))
        if r.random() < 0.3:
            headers.append((contract.SESSION_HEADER.encode(), self.session_name()))
        if r.random() < 0.08:
            headers.append((b"Content-Encoding", r.choice([b"gzip", b"deflate", b"br", b"zstd", b"x-nope"])))
        if r.random() < 0.05:
            headers.append((contract.NCCL_HEADER.encode(), b"1"))
            headers.append(
                (contract.SEQUENCE_HEADER.encode(), r.choice([b"0", b"-1", b"x", b"99999999999999999999"]))
            )
        return Case(method, "/" + path, headers, body)

    def session_name(self) -> bytes:
        r = self.rng
        return r.choice([b"a", b"b", b"", b"x" * r.randint(1, 4000), self.header_bytes(8)])

    def header_bytes(self, n: int) -> bytes:
        """Bytes HTTP allows in a header value (obs-text included), none that aiohttp's parser refuses."""
        return bytes(self.rng.choice([*range(0x20, 0x7F), *range(0x80, 0x100)]) for _ in range(n)).strip()

    def body(self, path: str) -> bytes:
        r = self.rng
        if path == contract.INIT_NCCL:
            return self.json_body()
        if path == contract.SET_VOCAB_MAPPING:
            return self.mutate(self.vocab_blob())
        if path == contract.GENERATE:
            return self.mutate(self.generate_blob())
        return r.choice([b"", b"{}", r.randbytes(r.randint(0, 64)), self.json_body()])

    def generate_blob(self) -> bytes:
        r = self.rng
        b, s = r.randint(1, 4), r.randint(1, 64)
        ids = torch.randint(
            0, self.vocab, (b, s), generator=torch.Generator().manual_seed(r.randrange(1 << 30))
        )
        return wire.encode(
            {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
        )

    def vocab_blob(self) -> bytes:
        r = self.rng
        ids = torch.tensor(r.sample(range(self.vocab), r.randint(1, self.vocab)))
        mask = torch.zeros(self.vocab, dtype=torch.bool)
        mask[ids] = True
        return wire.encode({"selected_token_ids": ids, "selected_token_mask": mask})

    def json_body(self) -> bytes:
        r = self.rng
        depth = r.choice([1, 10, 1000, 10_000, 100_000])
        return r.choice(
            [
                b"[" * depth + b"]" * depth,
                b'{"a":' * depth + b"1" + b"}" * depth,
                json.dumps({"nccl_port": r.choice([0, -1, 1, 70000, "9", None, 1.5, True, 10**30])}).encode(),
                json.dumps({"backend": r.choice(["gloo", "nccl", 7, None, "x" * 100])}).encode(),
                b'{"nccl_port": ' + b"9" * 5000 + b"}",
                r.randbytes(r.randint(0, 64)),
                b"\xff\xfe{}",
                b"null",
            ]
        )

    def mutate(self, blob: bytes) -> bytes:
        r = self.rng
        data = bytearray(blob)
        kind = r.randrange(9)
        if kind == 0:  # as is
            pass
        elif kind == 1:  # bit flips
            for _ in range(r.randint(1, 8)):
                data[r.randrange(len(data))] ^= 1 << r.randrange(8)
        elif kind == 2:  # truncated
            data = data[: r.randrange(len(data))]
        elif kind == 3:  # trailing garbage
            data += r.randbytes(r.randint(1, 32))
        elif (
            kind == 4
        ):  # a lying tensor header: huge, zero or negative dimensions, odd dtype codes, many dims
            data = bytearray(self.lying_entry())
        elif kind == 5:  # many tiny entries
            data = bytearray(
                wire.MAGIC_BYTES
                + b"".join(
                    struct.pack("<I", 1) + bytes([65 + i % 26]) + b"\x01" for i in range(r.randint(10, 5000))
                )
            )
        elif kind == 6:  # random bytes after the magic
            data = bytearray(wire.MAGIC_BYTES + r.randbytes(r.randint(0, 200)))
        elif kind == 7:  # overwrite a word with an extreme value
            pos = r.randrange(max(1, len(data) - 8))
            data[pos : pos + 8] = struct.pack("<q", r.choice([-1, 0, 2**62, 2**63 - 1, -(2**63)]))
        else:  # nothing at all
            data = bytearray()
        return bytes(data)

    def lying_entry(self) -> bytes:
        r = self.rng
        ndim = r.choice([0, 1, 2, 3, 8, 64, 65, 255])
        dims = [r.choice([0, 1, 2, 2**31, 2**62, 2**63 - 1]) for _ in range(ndim)]
        key = r.choice([b"input_ids", b"selected_token_mask", b"\xff\xfe", b""])
        code = r.choice([0, 4, 9, 10, 255])
        nbytes = r.choice([0, 8, 2**64 - 1])
        return (
            wire.MAGIC_BYTES
            + struct.pack("<I", len(key))
            + key
            + bytes([0, code, ndim])
            + struct.pack(f"<{ndim}q", *dims)
            + struct.pack("<Q", nbytes)
            + r.randbytes(r.choice([0, 8, 64]))
        )


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


async def raw_request(
    host: str, port: int, case: Case, timeout: float = 60.0, source: str | None = None
) -> Reply:
    """One request on a fresh connection (Connection: close) from ``source`` if given, read to EOF."""
    reader, writer = await asyncio.open_connection(host, port, local_addr=source and (source, 0))
    try:
        head = f"{case.method} {case.path} HTTP/1.1\r\n".encode()
        for key, value in [
            (b"Host", b"target"),
            *case.headers,
            (b"Content-Length", str(len(case.body)).encode()),
            (b"Connection", b"close"),
        ]:
            head += key + b": " + value + b"\r\n"
        writer.write(head + b"\r\n" + case.body)
        async with asyncio.timeout(timeout):
            data = await reader.read()
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not lines[0].startswith("HTTP/1."):
        raise AssertionError(f"no HTTP reply to {case.method} {case.path}: {data[:200]!r}")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return Reply(int(lines[0].split()[1]), headers, body)


def check_reply(case: Case, reply: Reply) -> None:
    """No 5xx; every 4xx carries the JSON {"error", "detail"}."""
    assert reply.status < 500, (case.method, case.path, case.headers, case.body[:200], reply)
    if reply.status >= 400:
        doc = json.loads(reply.body)
        assert isinstance(doc["error"], str) and isinstance(doc["detail"], str), reply


# -- a server in its own process ---------------------------------------------------------

_SERVE = """
import json, logging, sys
from eagle3_target.server.app import TargetServer
from eagle3_target.server.options import ServerOptions
from eagle3_target.server.p2p.options import P2POptions
from eagle3_target.server.process import listen, run_server
from eagle3_target.server.runners.synthetic import SyntheticRunner
shape, options, port = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
p2p = options.pop("p2p", {})
logging.basicConfig(level="INFO", format="%(levelname)s %(name)s: %(message)s")
server = TargetServer(lambda: SyntheticRunner(**shape), ServerOptions(**options, p2p=P2POptions(**p2p)))
sys.exit(run_server(server, listen("127.0.0.1", port)))
"""


class ServerProcess:
    """A synthetic-runner TargetServer served by run_server in a child process."""

    def __init__(self, shape: dict | None = None, preexec_fn=None, **options):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        args = [json.dumps(shape or {}), json.dumps(options), str(self.port)]
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop) -- not a pipe: a chatty server must never block on it
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE, *args],
            stderr=self.log,
            env=env,
            preexec_fn=preexec_fn,
        )

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.logs()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    if sock.recv(64).startswith(b"HTTP/1.1 200"):
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("server never became ready")

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def accepted_connections(self) -> int:
        """TCP connections on the server's port that the server has accepted (holds a descriptor for):
        exact, where a count of all its descriptors also moves with whatever else it opens and closes."""
        held = set()
        for fd in os.listdir(f"/proc/{self.proc.pid}/fd"):
            with contextlib.suppress(OSError):  # closed since listed
                held.add(os.readlink(f"/proc/{self.proc.pid}/fd/{fd}"))
        with open(f"/proc/{self.proc.pid}/net/tcp") as table:
            rows = [line.split() for line in table.readlines()[1:]]
        # columns: slot, local address:port (hex), remote, state (01: established), ..., inode (10th)
        return sum(
            int(row[1].rsplit(":", 1)[1], 16) == self.port and row[3] == "01" and f"socket:[{row[9]}]" in held
            for row in rows
        )

    def logs(self) -> str:
        if self.log.closed:
            return self.final_logs
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> str:
        """Kill the process if it still runs; return what it logged."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.final_logs = self.logs()
        self.log.close()
        return self.final_logs

    def __enter__(self):
        self.wait_ready()
        return self

    def __exit__(self, *exc):
        self.stop()
