"""Every malformed request gets a 4xx with {"error", "detail"}, and the server keeps serving."""

import json
import struct

import pytest
import torch
from hostile_support import Case, raw_request
from target_support import generate_body, serve, vocab_body

from eagle3_target.protocol import wire
from eagle3_target.server.options import DEFAULT_MAX_BATCH_TOKENS, ServerOptions
from eagle3_target.server.runners.synthetic import SyntheticRunner

V = 64
ok_ids = torch.zeros(2, 4, dtype=torch.long)
good_vocab = vocab_body(torch.arange(10), torch.ones(V, dtype=torch.bool))


def packed_body(seq_lens, position_ids=None, ids=ok_ids) -> bytes:
    """A [2, 4] batch with NeMo's packing metadata (position_ids default: a valid [0, 1, 0, 1] per row)."""
    ones = torch.ones_like(ids)
    extra = {"seq_lens": torch.as_tensor(seq_lens)} if seq_lens is not None else {}
    if position_ids is not False:
        extra["position_ids"] = torch.tensor([[0, 1, 0, 1]] * 2) if position_ids is None else position_ids
    return wire.encode({"input_ids": ids, "attention_mask": ones, "loss_mask": ones, **extra})


PACKING_CASES = [
    # (name, body, status, error): parsed before the capability is asked, so malformed metadata is named
    # as such on any server; well-formed metadata to a runner without packing is refused as not offered.
    ("packing: lengths not summing to S", packed_body([[2, 1], [2, 2]]), 400, "bad_packing"),
    ("packing: negative length", packed_body([[6, -2], [2, 2]]), 400, "bad_packing"),
    (
        "packing: more documents than tokens",
        packed_body([[1, 1, 1, 1, 0], [4, 0, 0, 0, 0]]),
        400,
        "bad_packing",
    ),
    ("packing: seq_lens for another batch", packed_body([[2, 2]]), 400, "bad_packing"),
    ("packing: seq_lens without position_ids", packed_body([[2, 2], [4, 0]], False), 400, "bad_packing"),
    ("packing: position_ids without seq_lens", packed_body(None), 400, "bad_packing"),
    (
        "packing: position past the row",
        packed_body([[2, 2], [4, 0]], torch.full((2, 4), 4)),
        400,
        "bad_packing",
    ),
    ("packing: negative position", packed_body([[2, 2], [4, 0]], torch.full((2, 4), -1)), 400, "bad_packing"),
    (
        "packing: int32 seq_lens",
        packed_body(torch.tensor([[2, 2], [4, 0]], dtype=torch.int32)),
        400,
        "wrong_dtype",
    ),
    ("packing: not offered by this runner", packed_body([[2, 2], [4, 0]]), 400, "packing_not_offered"),
]

CASES = [
    # (name, method, endpoint, body, needs vocab mapping first, status, error)
    ("bad magic", "POST", "generate", b"GFPS\0\0\0\0", True, 400, "bad_wire_blob"),
    ("truncated blob", "POST", "generate", generate_body(ok_ids)[:-3], True, 400, "bad_wire_blob"),
    ("empty body", "POST", "generate", b"", True, 400, "bad_wire_blob"),
    ("missing keys", "POST", "generate", wire.encode({"input_ids": ok_ids}), True, 400, "missing_keys"),
    (
        "None input",
        "POST",
        "generate",
        wire.encode({"input_ids": None, "attention_mask": ok_ids, "loss_mask": ok_ids}),
        True,
        400,
        "missing_keys",
    ),
    (
        "wrong dtype",
        "POST",
        "generate",
        generate_body(ok_ids.int(), ok_ids.int(), ok_ids.int()),
        True,
        400,
        "wrong_dtype",
    ),
    (
        "1-D input",
        "POST",
        "generate",
        generate_body(torch.zeros(4, dtype=torch.long)),
        True,
        400,
        "bad_shape",
    ),
    (
        "empty sequence",
        "POST",
        "generate",
        generate_body(torch.zeros(1, 0, dtype=torch.long)),
        True,
        400,
        "bad_shape",
    ),
    (
        "mask shape mismatch",
        "POST",
        "generate",
        generate_body(ok_ids, torch.ones(2, 5, dtype=torch.long)),
        True,
        400,
        "shape_mismatch",
    ),
    (
        "loss mask mismatch",
        "POST",
        "generate",
        generate_body(ok_ids, None, torch.ones(3, 4, dtype=torch.long)),
        True,
        400,
        "shape_mismatch",
    ),
    (
        "token id too large",
        "POST",
        "generate",
        generate_body(torch.full((1, 3), V)),
        True,
        422,
        "token_out_of_range",
    ),
    (
        "negative token id",
        "POST",
        "generate",
        generate_body(torch.full((1, 3), -1)),
        True,
        422,
        "token_out_of_range",
    ),
    ("generate before vocab", "POST", "generate", generate_body(ok_ids), False, 409, "no_vocab_mapping"),
    (
        "vocab ids out of range",
        "POST",
        "set_vocab_mapping",
        vocab_body(torch.tensor([0, V]), torch.ones(V, dtype=torch.bool)),
        False,
        422,
        "token_out_of_range",
    ),
    (
        "vocab mask wrong length",
        "POST",
        "set_vocab_mapping",
        vocab_body(torch.arange(4), torch.ones(V - 1, dtype=torch.bool)),
        False,
        422,
        "bad_mask_length",
    ),
    (
        "vocab mask wrong dtype",
        "POST",
        "set_vocab_mapping",
        vocab_body(torch.arange(4), torch.ones(V)),
        False,
        400,
        "wrong_dtype",
    ),
    (
        "vocab ids empty",
        "POST",
        "set_vocab_mapping",
        vocab_body(torch.zeros(0, dtype=torch.long), torch.ones(V, dtype=torch.bool)),
        False,
        400,
        "bad_shape",
    ),
    ("vocab not a blob", "POST", "set_vocab_mapping", b"{}", False, 400, "bad_wire_blob"),
    *[(name, "POST", "generate", body, True, status, error) for name, body, status, error in PACKING_CASES],
    ("unknown endpoint", "POST", "nope", b"", False, 404, "not_found"),
    ("trailing slash", "POST", "generate/", b"", False, 404, "not_found"),
    ("GET on a POST endpoint", "GET", "generate", b"", False, 405, "method_not_allowed"),
    ("POST on health", "POST", "health", b"", False, 405, "method_not_allowed"),
    ("PUT", "PUT", "model_info", b"", False, 405, "method_not_allowed"),
]


@pytest.fixture
async def srv():
    async with serve(lambda: SyntheticRunner(vocab_size=V)) as running:
        yield running


@pytest.mark.parametrize(
    "name, method, endpoint, body, vocab_first, status, error", CASES, ids=[c[0] for c in CASES]
)
async def test_bad_input_gets_a_json_4xx_and_the_server_keeps_serving(
    srv, name, method, endpoint, body, vocab_first, status, error
):
    if vocab_first:
        assert (await srv.post("set_vocab_mapping", good_vocab)).status == 200
    async with srv.http.request(method, f"{srv.url}/{endpoint}", data=body) as resp:
        assert resp.status == status
        assert resp.headers["Content-Type"].startswith("application/json")
        doc = await resp.json()
    assert doc["error"] == error and isinstance(doc["detail"], str) and doc["detail"]
    # Nothing lost: the same connection pool goes on with a valid batch.
    await srv.post("set_vocab_mapping", good_vocab)
    async with srv.http.post(f"{srv.url}/generate", data=generate_body(ok_ids)) as resp:
        assert resp.status == 200
        out = wire.decode(bytearray(await resp.read()))
    assert out["target_probs"].shape == (2, 4, 10)


@pytest.mark.parametrize(
    "method, endpoint, allowed",
    [("GET", "generate", {"POST"}), ("PUT", "model_info", {"POST"}), ("POST", "health", {"GET", "HEAD"})],
)
async def test_a_405_says_which_methods_the_endpoint_takes(srv, method, endpoint, allowed):
    async with srv.http.request(method, f"{srv.url}/{endpoint}") as resp:
        assert resp.status == 405
        assert set(resp.headers["Allow"].split(",")) == allowed, resp.headers


def _lying_blob(key: bytes, code: int, shape: list[int], nbytes: int) -> bytes:
    return (
        wire.MAGIC_BYTES
        + struct.pack("<I", len(key))
        + key
        + bytes([0, code, len(shape)])
        + struct.pack(f"<{len(shape)}q", *shape)
        + struct.pack("<Q", nbytes)
    )


HOSTILE = [
    # (name, endpoint, headers, body, status, error)
    (
        "zero-element tensor with huge dimensions",
        "generate",
        {},
        _lying_blob(b"input_ids", 4, [0, 2**62, 4], 0),
        400,
        "bad_wire_blob",
    ),
    (
        "a blob of many tiny entries",
        "set_vocab_mapping",
        {},
        wire.MAGIC_BYTES
        + b"".join(struct.pack("<I", 2) + b"%02d" % (i % 100) + b"\x01" for i in range(5000)),
        400,
        "bad_wire_blob",
    ),
    (
        "gzip that is not gzip",
        "set_vocab_mapping",
        {"Content-Encoding": "gzip"},
        b"garbage",
        415,
        "unsupported_content_encoding",
    ),
    ("brotli", "generate", {"Content-Encoding": "br"}, b"garbage", 415, "unsupported_content_encoding"),
    ("deeply nested JSON", "init_nccl", {}, b"[" * 20_000 + b"]" * 20_000, 400, "bad_json"),
    ("a big /init_nccl body", "init_nccl", {}, b" " * 100_000 + b"{}", 413, "request_entity_too_large"),
    (
        "batch x sequence over --max-batch-tokens",
        "generate",
        {},
        generate_body(torch.zeros(2, DEFAULT_MAX_BATCH_TOKENS // 2 + 1, dtype=torch.long)),
        413,
        "batch_too_large",
    ),
    ("non-UTF-8 Authorization", "heartbeat", {"Authorization": b"Bearer \xff\xfe"}, b"", 401, "unauthorized"),
]


@pytest.mark.parametrize("name, endpoint, headers, body, status, error", HOSTILE, ids=[c[0] for c in HOSTILE])
async def test_hostile_input_gets_a_json_4xx(name, endpoint, headers, body, status, error):
    async with serve(lambda: SyntheticRunner(vocab_size=V), ServerOptions(auth_token="t")) as srv:
        host, port = srv.url.removeprefix("http://").split(":")
        headers = {"Authorization": b"Bearer t", **headers}
        case = Case(
            "POST",
            f"/{endpoint}",
            [(k.encode(), v if isinstance(v, bytes) else v.encode()) for k, v in headers.items()],
            body,
        )
        await raw_request(host, int(port), Case("POST", "/set_vocab_mapping", case.headers[:1], good_vocab))
        reply = await raw_request(host, int(port), case)
        assert reply.status == status, reply
        assert json.loads(reply.body)["error"] == error
        assert (await srv.get("health")).status == 200
