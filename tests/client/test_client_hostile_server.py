"""A trainer no server can break: each case is a hostile server (hostile_server.py) in front of a real
one, with a healthy server beside it or alone; the trainer runs in its own process (trainer_worker.py).

Every case checks three things: the trainer's peak memory (VmHWM) stays within PEAK_MB of where the
case started, every batch is bit-exact against the reference or the error is a clean one the trainer
can handle, and the trainer process lives on (it serves every later case). docs/client.md's threat
model lists the cases and what each did before.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

from eagle3_target.protocol import contract, wire

from .hostile_server import (
    HostileProxy,
    always,
    declared,
    edit_blob,
    endless,
    entry,
    json_response,
    mangle,
    response,
    self_signed,
)

PEAK_MB = 48  # every reply here is bounded by a limit of at most 1 MiB (JSON) or the batch's ~80 KB
CLEAN_ERRORS = ("BatchFailedError", "RequestRejected")
OPTIONS = {
    "deadline": 8.0,
    "start_timeout": 4.0,
    "request_timeout": 4.0,
    "backoff_base": 0.01,
    "backoff_max": 0.2,
    "readmit_backoff_max": 0.5,
    "hedge_after": 3.0,
}


class Trainer:
    """The worker process: one case in, one result out; it must outlive every case."""

    def __init__(self, stderr_path: Path, ca_file: str):
        self.stderr = stderr_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("trainer_worker.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "SSL_CERT_FILE": ca_file},  # trusts the test's https
        )
        assert json.loads(self.process.stdout.readline()) == {"ready": True}

    def run(self, **case) -> dict:
        self.process.stdin.write(json.dumps({"options": OPTIONS, "batches": 3, **case}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"the trainer process died (exit {self.process.wait(10)})"
        return json.loads(line)

    def close(self) -> None:
        self.process.stdin.close()
        assert self.process.wait(30) == 0, "the trainer process did not exit cleanly"
        self.stderr.close()


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def trainer(tmp_path_factory, tls):
    stderr = tmp_path_factory.mktemp("trainer") / "stderr.log"
    worker = Trainer(stderr, ca_file=tls[0])
    yield worker
    worker.close()
    logged = stderr.read_text()
    assert "Task exception was never retrieved" not in logged, logged[-3000:]


@pytest.fixture(scope="module")
def servers():
    """A healthy server and the real one behind each hostile proxy (same synthetic model)."""
    from tests.client.conftest import ServerFarm

    farm = ServerFarm()
    yield farm.start("127.0.0.2"), farm.start("127.0.0.3")
    farm.close()


@pytest.fixture
def hostile(servers):
    proxies = []

    def make(rules) -> str:
        proxy = HostileProxy(servers[1], rules)
        proxies.append(proxy)
        return proxy.start()

    yield make
    for proxy in proxies:
        proxy.close()


def _bounded(result: dict) -> None:
    assert "wrong" not in result, result["wrong"]  # a batch that is not the reference's
    assert result["peak_mb"] < PEAK_MB, f"trainer peak memory rose {result['peak_mb']:.0f} MB"


def _served(result: dict) -> None:
    _bounded(result)
    assert result["error"] is None, result
    assert result["correct"] == 3


def _clean(result: dict) -> None:
    _bounded(result)
    assert result["error"] and result["error"].split(":")[0] in CLEAN_ERRORS, result


# -- the replies ------------------------------------------------------------------------------

MAGIC = wire.MAGIC_BYTES
GIB = 1 << 30


def _gzip_bomb(expanded: int = 256 << 20) -> bytes:
    packer, zeros = zlib.compressobj(9, zlib.DEFLATED, 31), bytes(1 << 20)
    return b"".join(packer.compress(zeros) for _ in range(expanded >> 20)) + packer.flush()


def _tiny_entries(size: int) -> bytes:
    count = (size - 4) // 9
    return MAGIC + b"".join(struct.pack("<I", 4) + struct.pack("<I", i) + b"\x01" for i in range(count))


def _blob_reply(body: bytes, headers: dict | None = None) -> bytes:
    return response(200, body, {"Content-Type": "application/octet-stream", **(headers or {})}).encode()


def _nested(depth: int = 200_000) -> bytes:
    return b"[" * depth + b"]" * depth


def _duplicate_first_key(answer):
    """A second copy of the first tensor, zeroed: a reader where the last copy wins gets wrong supervision."""
    tensors = wire.decode(bytearray(answer.body))
    first = list(tensors)[0]
    answer.body = answer.body + wire.encode({first: tensors[first] * 0})[4:]
    return answer


def _nan(tensors: dict) -> dict:
    tensors["aux_hidden_states"] = tensors["aux_hidden_states"].clone()
    tensors["aux_hidden_states"][0, 0, 0] = float("nan")
    return tensors


def _model_info(edit):
    def apply(answer):
        answer.body = json.dumps(edit(json.loads(answer.body))).encode()
        return answer

    return mangle(apply)


# Each case: the hostile server's rules, what the trainer does; a healthy server sits beside it.
BESIDE = {
    # 1. memory set by the reply
    "503 declaring 6 GiB": {"generate": always(declared(503, 6 * GIB, b'{"error": "x"'))},
    "503 declaring 10^13 bytes": {"generate": always(declared(503, 10**13))},
    "200 declaring 6 GiB": {"generate": always(declared(200, 6 * GIB, MAGIC))},
    "a 4 GB key in an 18-byte reply": {
        "generate": always(_blob_reply(MAGIC + struct.pack("<I", 0xFFFFFFF0) + b"x" * 10))
    },
    "a gzip bomb": {"generate": always(_blob_reply(_gzip_bomb(), {"Content-Encoding": "gzip"}))},
    "an endless chunked body": {"generate": always(endless(200, chunked=True))},
    "an endless close-delimited body": {"generate": always(endless(200, chunked=False))},
    "/health streaming 2 GiB": {"health": always(endless(200, chunked=True))},
    "12 MiB of tiny entries": {"generate": always(_blob_reply(_tiny_entries(12 << 20)))},
    "tiny entries within the size limit": {"generate": always(_blob_reply(_tiny_entries(8 << 10)))},
    # 2. faults that must fail over
    "Content-Length shorter than the body": {
        "generate": mangle(lambda a: a.encode(content_length=len(a.body) - 100))
    },
    "a bad status line": {"generate": always(b"HTTP/1.1 OK-ish\r\n\r\n")},
    "a bad header": {
        "generate": always(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nBad\x00Header: x\r\n\r\nhello")
    },
    "409 forever": {
        "generate": always(json_response(409, {"error": "no_vocab_mapping", "detail": "lost"}).encode())
    },
    "429 forever without Retry-After": {"generate": always(json_response(429, {"error": "busy"}).encode())},
    "deeply nested error JSON": {"generate": always(response(503, _nested()).encode())},
    "a 4 TiB tensor header": {
        "generate": always(_blob_reply(MAGIC + entry(b"aux_hidden_states", 0, [1 << 10] * 4, 4 << 40)))
    },
    "a 400 for every batch": {
        "generate": always(json_response(400, {"error": "bad", "detail": "no"}).encode())
    },
    "a 400 for the vocab mapping": {
        "set_vocab_mapping": always(json_response(400, {"error": "bad", "detail": "no"}).encode())
    },
    # 3. wrong tensors
    "a duplicated key": {"generate": mangle(_duplicate_first_key)},
    "NaN supervision": {"generate": mangle(edit_blob(_nan))},
    # 4. tasks that must not die
    "/model_info answering HTML": {"model_info": always(response(200, b"<html>hi</html>").encode())},
    "/model_info with a null field": {"model_info": _model_info(lambda d: {**d, "hidden_size": None})},
    "/model_info with a 5000-digit integer": {
        "model_info": always(response(200, b'{"num_hidden_layers": ' + b"9" * 5000 + b"}").encode())
    },
    "/model_info nested 200,000 deep": {"model_info": always(response(200, _nested()).encode())},
    "/model_info declaring hidden_size 10^30": {
        "model_info": _model_info(lambda d: {**d, "hidden_size": 10**30})
    },
    "/model_info with aux ids out of range": {
        "model_info": _model_info(lambda d: {**d, "aux_layer_ids": [1, 2, 99]})
    },
    "heartbeats answered with HTML": {"heartbeat": always(response(200, b"<html>").encode())},
}


@pytest.mark.parametrize("name", list(BESIDE))
def test_a_hostile_server_beside_a_healthy_one_costs_nothing(trainer, servers, hostile, name):
    url = hostile(BESIDE[name])
    options = {**OPTIONS, "heartbeat_interval": 0.2}
    _served(
        trainer.run(endpoints=[url, servers[0]], options=options, settle=2.0, linger=LINGER.get(name, 0.0))
    )


LINGER = {"heartbeats answered with HTML": 1.5}  # long enough for several heartbeats, rejoins and failures


ALONE = [
    "503 declaring 10^13 bytes",
    "a 4 GB key in an 18-byte reply",
    "a gzip bomb",
    "409 forever",
    "a 400 for every batch",
    "/model_info answering HTML",
    "NaN supervision",
]


@pytest.mark.parametrize("name", ALONE)
def test_a_hostile_server_alone_is_a_clean_error(trainer, hostile, name):
    """With no healthy server, the trainer gets BatchFailedError or RequestRejected naming why."""
    result = trainer.run(endpoints=[hostile(BESIDE[name])])
    _clean(result)


# -- cases that need a server with a memory ---------------------------------------------------


def _stale_generate(strip_binding: bool):
    """Every /generate answered with the reply to the one before it (the first is answered honestly)."""
    previous = []

    async def rule(request, forward):
        answer = await forward()
        previous.append(answer)
        stale = previous[-2] if len(previous) > 1 else answer
        if strip_binding:
            stale.headers = {k: v for k, v in stale.headers.items() if not k.startswith("X-Eagle3-Request")}
        return stale.encode()

    return rule


def _without_binding(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "request_binding"}


@pytest.mark.parametrize(
    "encoding, rules",
    [
        ("logits", {"generate": _stale_generate(strip_binding=False)}),
        # a NeMo-like server (no request_binding): the echoed input_ids and loss_mask give it away
        (
            "nemo",
            {"generate": _stale_generate(strip_binding=True), "model_info": _model_info(_without_binding)},
        ),
    ],
)
def test_a_reply_to_the_previous_batch_is_refused(trainer, servers, hostile, encoding, rules):
    url = hostile(rules)
    result = trainer.run(endpoints=[url, servers[0]], encoding=encoding, settle=2.0, batches=4)
    _served({**result, "correct": min(result["correct"], 3)})
    assert result["failovers"] >= 1, result  # the stale replies were caught, not lucky


def test_a_server_back_as_another_model_after_a_409_is_refused(trainer, servers, hostile):
    """One 409 no_vocab_mapping, then /model_info names another config: the mapping is re-sent, the model
    read again, and the server refused (before: the other model's tensors were accepted)."""
    asked = {"generate": 0}

    async def generate(request, forward):
        asked["generate"] += 1
        if asked["generate"] == 1:
            return json_response(409, {"error": "no_vocab_mapping", "detail": "restarted"}).encode()
        return None

    calls = {"model_info": 0}

    async def model_info(request, forward):
        calls["model_info"] += 1
        answer = await forward()
        if calls["model_info"] > 1:  # the first answer is the fleet check at start
            doc = json.loads(answer.body)
            answer.body = json.dumps({**doc, "config_digest": "another-model00"}).encode()
        return answer.encode()

    url = hostile({"generate": generate, "model_info": model_info})
    result = trainer.run(endpoints=[url, servers[0]], settle=2.0, linger=0.5)
    _served(result)
    assert f"{url} refused" in result["servers"] and "config_digest" in result["servers"], result["servers"]


@pytest.mark.parametrize(
    "weight",
    [
        _blob_reply(wire.encode({"weight": torch.zeros(7, 3, dtype=torch.bfloat16)})),
        _blob_reply(MAGIC + struct.pack("<I", 0xFFFFFFF0) + b"x" * 10),
        declared(200, 10**13),
    ],
    ids=["shape [7, 3]", "a 4 GB key", "declaring 10^13 bytes"],
)
def test_input_embeddings_must_match_the_agreed_shape(trainer, servers, hostile, weight):
    """Alone, the wrong weight is refused (a clean error); beside a healthy server, the right one arrives."""
    rules = {contract.INPUT_EMBEDDINGS: always(weight)}
    _clean(trainer.run(endpoints=[hostile(rules)], embeddings=True, options={**OPTIONS, "deadline": 2.0}))
    _served(trainer.run(endpoints=[hostile(rules), servers[0]], settle=2.0, embeddings=True))


def test_lm_head_rows_must_match_the_agreed_shape(trainer, servers, hostile):
    rules = {contract.LM_HEAD: always(_blob_reply(MAGIC + struct.pack("<I", 0xFFFFFFF0) + b"x" * 10))}
    options = {**OPTIONS, "deadline": 2.0}
    _clean(trainer.run(endpoints=[hostile(rules)], encoding="hidden", options=options))
    _served(trainer.run(endpoints=[hostile(rules), servers[0]], settle=2.0, encoding="hidden"))


def test_garbage_during_the_409_recovery_fails_over(trainer, servers, hostile):
    """/generate says the session is gone; re-sending the mapping gets HTML (before: JSONDecodeError raised
    into generate_batch)."""
    sent = {"set_vocab_mapping": 0}

    async def set_vocab_mapping(request, forward):
        sent["set_vocab_mapping"] += 1
        return None if sent["set_vocab_mapping"] == 1 else response(200, b"<html>").encode()

    rules = {
        "generate": always(json_response(409, {"error": "no_vocab_mapping", "detail": "lost"}).encode()),
        "set_vocab_mapping": set_vocab_mapping,
    }
    _served(trainer.run(endpoints=[hostile(rules), servers[0]], settle=2.0))


def test_429_with_retry_after_is_backpressure_not_a_fault(trainer, servers, hostile):
    """The throttled server is waited for, never quarantined, and the batches go where there is room."""
    busy = json_response(429, {"error": "busy", "detail": "queue full"}, {"Retry-After": "1"}).encode()
    url = hostile({"generate": always(busy)})
    result = trainer.run(endpoints=[url, servers[0]], settle=2.0)
    _served(result)
    assert result["failovers"] == 0 and f"{url} healthy" in result["servers"], result


def test_429_with_retry_after_alone_waits_then_is_served(trainer, hostile):
    answered = {"n": 0}

    async def generate(request, forward):
        answered["n"] += 1
        if answered["n"] <= 2:
            return json_response(429, {"error": "busy"}, {"Retry-After": "0.3"}).encode()
        return None

    result = trainer.run(endpoints=[hostile({"generate": generate})])
    _served(result)
    assert result["failovers"] == 0, result


# -- the feature-capture path and whole weights (i31's client API) -----------------------------

FEATURES = {"layers": [3, -1], "final_hidden": True, "logits": "full"}
CAPTURE = {
    "200 declaring 6 GiB": {"generate": always(declared(200, 6 * GIB, MAGIC))},
    "a 4 GB key": {"generate": always(_blob_reply(MAGIC + struct.pack("<I", 0xFFFFFFF0) + b"x" * 10))},
    "an endless chunked body": {"generate": always(endless(200, chunked=True))},
    "NaN hidden states": {
        "generate": mangle(edit_blob(lambda t: {**t, "hidden_states": t["hidden_states"] * float("nan")}))
    },
    "a duplicated key": {"generate": mangle(_duplicate_first_key)},
    "the previous batch's reply": {"generate": _stale_generate(strip_binding=False)},
}


@pytest.mark.parametrize("name", list(CAPTURE))
def test_a_capture_reply_is_bounded_and_checked_like_supervision(trainer, servers, hostile, name):
    """The limit of a capture reply follows from its features and the batch's shape."""
    url = hostile(CAPTURE[name])
    result = trainer.run(endpoints=[url, servers[0]], settle=2.0, features=FEATURES, captures=4, batches=0)
    _served({**result, "correct": result["correct"] - 1})  # four captures: the stale server is asked twice
    assert result["failovers"] >= 1, result  # the hostile server was asked, and refused


@pytest.mark.parametrize(
    "weight",
    [
        _blob_reply(wire.encode({"weight": torch.zeros(7, 3, dtype=torch.bfloat16)})),
        _blob_reply(MAGIC + struct.pack("<I", 0xFFFFFFF0) + b"x" * 10),
        declared(200, 10**13),
    ],
    ids=["shape [7, 3]", "a 4 GB key", "declaring 10^13 bytes"],
)
def test_whole_weights_must_match_the_agreed_shape(trainer, servers, hostile, weight):
    rules = {f"{contract.WEIGHTS}/lm_head": always(weight)}
    options = {**OPTIONS, "deadline": 2.0}
    _clean(trainer.run(endpoints=[hostile(rules)], features=FEATURES, weights=["lm_head"], options=options))
    result = trainer.run(
        endpoints=[hostile(rules), servers[0]], settle=2.0, features=FEATURES, weights=["lm_head"]
    )
    _served({**result, "correct": 3})


def test_an_https_endpoint_is_served_over_tls(trainer, servers, tls):
    """The bearer token's protection without a mesh: an https:// endpoint (a TLS front of a real server,
    its certificate trusted through SSL_CERT_FILE) serves exact batches."""
    proxy = HostileProxy(servers[1], tls=tls[1])
    try:
        url = proxy.start()
        assert url.startswith("https://")
        _served(trainer.run(endpoints=[url], encoding="logits"))
        assert proxy.seen["generate"] >= 3
    finally:
        proxy.close()
