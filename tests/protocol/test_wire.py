import asyncio
import contextlib
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle3_target.protocol import wire
from eagle3_target.protocol.receive_pool import ReceivePool
from eagle3_target.protocol.wire import CODE_TO_DTYPE, DTYPE_TO_CODE, EncodedBlob, WireError, decode, encode

SPEC_EXAMPLE = bytes.fromhex(
    "54454d4e03000000696473000401020000000000000010000000000000000700000000000000ffffffffffffffff010000006d01"
)


def test_spec_worked_example_encodes_byte_for_byte():
    blob = encode({"ids": torch.tensor([7, -1], dtype=torch.int64), "m": None})
    assert blob == SPEC_EXAMPLE
    assert len(blob) == 52


def test_spec_worked_example_decodes():
    out = decode(bytearray(SPEC_EXAMPLE))
    assert list(out) == ["ids", "m"]
    assert out["ids"].dtype == torch.int64 and out["ids"].tolist() == [7, -1]
    assert out["m"] is None


def test_dtype_codes_match_the_spec():
    assert {str(d).removeprefix("torch."): c for d, c in DTYPE_TO_CODE.items()} == {
        "float32": 0,
        "float64": 1,
        "float16": 2,
        "bfloat16": 3,
        "int64": 4,
        "int32": 5,
        "int16": 6,
        "int8": 7,
        "uint8": 8,
        "bool": 9,
    }


@pytest.mark.parametrize("dtype", list(DTYPE_TO_CODE))
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3, 4), (1, 0, 5)])
def test_round_trip_every_dtype_and_shape(dtype, shape):
    source = (torch.randn(shape) * 50).to(dtype)
    out = decode(bytearray(encode({"t": source})))["t"]
    assert out.dtype == dtype and out.shape == source.shape
    assert torch.equal(out, source)


def test_non_contiguous_input_is_encoded_in_logical_order():
    base = torch.arange(12, dtype=torch.int32).view(3, 4)
    out = decode(bytearray(encode({"t": base.t()})))["t"]
    assert torch.equal(out, base.t())


def test_bf16_is_sent_as_its_raw_bit_pattern():
    t = torch.tensor([1.0, -2.5], dtype=torch.bfloat16)
    blob = encode({"x": t})
    assert blob[-4:] == t.view(torch.int16).numpy().tobytes()


def test_decode_is_zero_copy_on_a_writable_buffer():
    buf = bytearray(encode({"a": torch.arange(1000, dtype=torch.float32)}))
    t = decode(buf)["a"]
    base = torch.frombuffer(buf, dtype=torch.uint8).data_ptr()
    assert base <= t.data_ptr() < base + len(buf)
    t[0] = 42.0  # writable and shared
    assert decode(buf)["a"][0] == 42.0


def test_encoded_blob_streams_tensor_storage_without_copies():
    big = torch.arange(3 << 20, dtype=torch.uint8)
    blob = EncodedBlob({"big": big})
    chunks = list(blob.chunks(max_chunk=1 << 20))
    assert sum(len(c) for c in chunks) == blob.nbytes == len(blob.tobytes())
    data_chunks = [c for c in chunks if isinstance(c, memoryview) and len(c) == 1 << 20]
    assert len(data_chunks) == 3
    addr = torch.frombuffer(data_chunks[0], dtype=torch.uint8).data_ptr()
    assert addr == big.data_ptr()


def test_encode_rejects_unsupported_dtypes_and_devices():
    with pytest.raises(WireError, match="no wire code"):
        encode({"x": torch.zeros(2, dtype=torch.uint16)})
    with pytest.raises(WireError, match="meta"):
        encode({"x": torch.zeros(2, device="meta")})


def _entry(key: bytes, code: int, shape: list[int], nbytes: int, data: bytes = b"") -> bytes:
    return (
        struct.pack("<I", len(key))
        + key
        + bytes([0, code, len(shape)])
        + struct.pack(f"<{len(shape)}q", *shape)
        + struct.pack("<Q", nbytes)
        + data
    )


@pytest.mark.parametrize(
    "blob, message",
    [
        (b"", "truncated"),
        (b"TEM", "truncated"),
        (b"GFPS" + b"\0" * 8, "bad magic"),  # SpecForge's magic is not NeMo's
        (wire.MAGIC_BYTES + b"\x05\0\0\0ab", "truncated"),
        (wire.MAGIC_BYTES + b"\x01\0\0\0\xff\x00", "not UTF-8"),
        (wire.MAGIC_BYTES + _entry(b"x", 42, [1], 4, b"\0" * 4), "unknown dtype code 42"),
        (wire.MAGIC_BYTES + _entry(b"x", 0, [2], 4, b"\0" * 4), "disagrees"),
        (wire.MAGIC_BYTES + _entry(b"x", 0, [-1], 4, b"\0" * 4), "negative"),
        (wire.MAGIC_BYTES + _entry(b"x", 0, [1 << 40, 1 << 20], 1 << 62), "truncated"),
        (wire.MAGIC_BYTES + _entry(b"x", 0, [1 << 40, 1 << 40], 0), "disagrees"),
        (wire.MAGIC_BYTES + _entry(b"x", 4, [4], 32, b"\0" * 8), "truncated"),
        (wire.MAGIC_BYTES + b"\x01\0\0\0x\x00\x00\xff" + b"\0" * 16, "truncated"),  # ndim 255, no room
        (wire.MAGIC_BYTES + _entry(b"x", 4, [0, 1 << 62, 4], 0), "not a valid"),  # strides overflow
    ],
)
def test_hostile_buffers_raise_one_clear_error(blob, message):
    with pytest.raises(WireError, match=message):
        decode(bytearray(blob))
    with pytest.raises(WireError, match=message):
        read_streamed(blob)


class _Chunks:
    """A wire.ByteSource over bytes that hands out at most ``chunk`` bytes per read, like a socket."""

    def __init__(self, blob: bytes, chunk: int):
        self.blob, self.chunk, self.pos = memoryview(blob), chunk, 0
        self.reads = 0

    async def readinto(self, view: memoryview) -> None:
        filled = 0
        while filled < len(view):
            piece = self.blob[self.pos : self.pos + min(self.chunk, len(view) - filled)]
            if not piece:
                raise EOFError("stream ended")
            view[filled : filled + len(piece)] = piece
            filled += len(piece)
            self.pos += len(piece)
            self.reads += 1


def read_streamed(blob: bytes, chunk: int = 7, **kwargs):
    return asyncio.run(wire.read_blob(_Chunks(blob, chunk), len(blob), **kwargs))


def test_read_blob_fills_one_fresh_tensor_per_entry():
    big = torch.arange(1 << 20, dtype=torch.float32)
    sent = {"big": big, "ids": torch.tensor([7, -1]), "none": None, "empty": torch.zeros(0, 3)}
    out = read_streamed(encode(sent), chunk=65536)
    assert list(out) == list(sent) and out["none"] is None
    for key in ("big", "ids", "empty"):
        assert out[key].dtype == sent[key].dtype and torch.equal(out[key], sent[key])
    assert out["big"].data_ptr() != out["ids"].data_ptr()
    out["big"][0] = 5.0  # writable, and its own storage
    assert big[0] == 0.0


def test_read_blob_refuses_a_tensor_larger_than_the_body_before_allocating():
    source = _Chunks(wire.MAGIC_BYTES + _entry(b"x", 0, [1 << 38], 1 << 40), 4096)
    with pytest.raises(WireError, match="truncated blob: data of 'x' needs 1099511627776 bytes"):
        asyncio.run(wire.read_blob(source, len(source.blob)))


def test_read_blob_reads_no_further_than_the_declared_size():
    blob = encode({"a": torch.arange(3)})
    source = _Chunks(blob + b"trailing bytes of the next message", 5)
    assert asyncio.run(wire.read_blob(source, len(blob)))["a"].tolist() == [0, 1, 2]
    assert source.pos == len(blob)


def _tiny_entries(count: int) -> bytes:
    return wire.MAGIC_BYTES + b"".join(struct.pack("<I", 3) + b"k%02d" % i + b"\x01" for i in range(count))


def test_read_blob_max_entries():
    with pytest.raises(WireError, match="more than 16 entries"):
        read_streamed(_tiny_entries(20), max_entries=16)
    with pytest.raises(WireError, match=f"more than {wire.MAX_ENTRIES} entries"):
        read_streamed(_tiny_entries(wire.MAX_ENTRIES + 1))


def test_max_entries_bounds_the_work_on_a_blob_of_tiny_entries():
    blob = _tiny_entries(100)
    assert len(decode(bytearray(blob), max_entries=100)) == 100
    with pytest.raises(WireError, match="more than 16 entries"):
        decode(bytearray(blob), max_entries=16)
    with pytest.raises(WireError, match=f"more than {wire.MAX_ENTRIES} entries"):
        decode(bytearray(blob))  # every reader is bounded, not only those that ask


def test_repeated_keys_are_refused_by_both_readers():
    blob = wire.MAGIC_BYTES + _entry(b"k", 7, [1], 1, b"\x01") + _entry(b"k", 7, [1], 1, b"\x02")
    with pytest.raises(WireError, match="'k' appears twice"):
        decode(bytearray(blob))
    with pytest.raises(WireError, match="'k' appears twice"):
        read_streamed(blob)


@pytest.mark.parametrize("key_len", [wire.MAX_KEY_BYTES + 1, 0xFFFFFFF0])
def test_a_key_length_is_checked_before_anything_is_allocated_for_it(key_len):
    """An 18-byte blob declaring a 4 GB key: refused from its header (it cost 4.1 GB per reply before)."""
    blob = wire.MAGIC_BYTES + struct.pack("<I", key_len) + b"x" * 10
    for read in (lambda: decode(bytearray(blob)), lambda: read_streamed(blob)):
        with pytest.raises(WireError, match=f"a key of {key_len} bytes"):
            read()


def test_read_only_buffers_decode_to_private_copies():
    blob = encode({"a": torch.arange(4, dtype=torch.int16)})
    out = decode(blob)["a"]
    out[0] = 9
    assert decode(blob)["a"][0] == 0


_tensors = st.builds(
    lambda code, shape: (
        (torch.arange(max(1, int(torch.tensor(shape).prod())) * 3) % 7)[: int(torch.tensor(shape).prod())]
        .view(shape)
        .to(CODE_TO_DTYPE[code])
    ),
    st.sampled_from(sorted(CODE_TO_DTYPE)),
    st.lists(st.integers(0, 4), max_size=3).map(tuple),
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=8), st.one_of(st.none(), _tensors), max_size=4))
def test_round_trip_property(tensors):
    blob = encode(tensors)
    for out in (decode(bytearray(blob)), read_streamed(blob)):
        assert list(out) == list(tensors)
        for key, value in tensors.items():
            if value is None:
                assert out[key] is None
            else:
                assert out[key].dtype == value.dtype and torch.equal(out[key], value)


_VALID = encode(
    {"input_ids": torch.arange(6).view(2, 3), "mask": torch.ones(2, 3, dtype=torch.bool), "n": None}
)


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_fuzzed_buffers_decode_or_raise_wire_error(data):
    """Truncate, flip and splice a valid blob: decode must return or raise WireError, nothing else."""
    blob = bytearray(_VALID)
    for _ in range(data.draw(st.integers(0, 4))):
        pos = data.draw(st.integers(0, len(blob) - 1))
        blob[pos] = data.draw(st.integers(0, 255))
    blob = blob[: data.draw(st.integers(0, len(blob)))] + data.draw(st.binary(max_size=16))
    for read in (decode, read_streamed):
        try:
            out = read(bytes(blob))
        except WireError:
            continue
        for value in out.values():
            assert value is None or value.numel() * value.element_size() <= len(blob)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_never_crash(blob):
    with contextlib.suppress(WireError):
        decode(bytearray(wire.MAGIC_BYTES + blob))


def test_receive_pool_reuses_a_buffer_only_once_every_view_of_it_is_gone():
    pool = ReceivePool(max_free_bytes=8 << 20)
    first = pool.empty((1 << 20,), torch.float32)
    address, view = first.data_ptr(), first[10:].view(torch.int32)
    del first
    second = pool.empty((1 << 20,), torch.float32)
    assert second.data_ptr() != address  # ``view`` still uses it
    del view
    third = pool.empty((2, 1 << 19), torch.float32)
    assert third.data_ptr() == address and third.shape == (2, 1 << 19)


def test_receive_pool_keeps_at_most_max_free_bytes():
    pool = ReceivePool(max_free_bytes=6 << 20)
    held = [pool.empty((1 << 20,), torch.float32) for _ in range(3)]  # 3 x 4 MiB
    assert pool.free_bytes == 0
    del held
    assert pool.free_bytes == 4 << 20  # only one fits under 6 MiB
    small = pool.empty((1000,), torch.float32)  # under min_bytes: torch's own allocation
    del small
    assert pool.free_bytes == 4 << 20
    again = pool.empty((1 << 20,), torch.float32)
    assert pool.free_bytes == 0 and again.shape == (1 << 20,)


def _decoded_or_error(read):
    try:
        return {k: None if v is None else (v.dtype, v.tolist()) for k, v in read().items()}
    except WireError as exc:
        return str(exc)


def test_a_streamed_blob_is_read_as_decode_reads_it_at_every_truncation():
    """Cut a blob after every byte: read_blob answers as decode does, the same entries or the same error word for
    word (which field, how many bytes it needs, where, how many are left)."""
    blob = encode(
        {
            "none": None,
            "ids": torch.tensor([[7, -1], [3, 4]]),
            "half": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        }
    )
    answers = set()
    for cut in range(len(blob) + 1):
        part = blob[:cut]
        expected = _decoded_or_error(lambda part=part: decode(bytearray(part)))
        assert _decoded_or_error(lambda part=part: read_streamed(part, chunk=3)) == expected, cut
        answers.add(expected if isinstance(expected, str) else "decoded")
    assert "truncated blob: magic needs 4 bytes at offset 0, 3 left" in answers
    assert "truncated blob: key length needs 4 bytes at offset 4, 2 left" in answers
    assert "truncated blob: key needs 4 bytes at offset 8, 1 left" in answers
    for what in ("flags", "dtype", "ndim", "shape", "nbytes", "data"):
        assert any(a.startswith(f"truncated blob: {what} of 'ids' needs") for a in answers), what


@pytest.mark.parametrize(
    "blob",
    [
        wire.MAGIC_BYTES + b"\x01\0\0\0x\x00" + _entry(b"\xff", 0, [1], 4, b"\0" * 4),
        wire.MAGIC_BYTES + _entry(b"x", 42, [1], 4, b"\0" * 4),
        wire.MAGIC_BYTES + _entry(b"x", 200, [1], 4, b"\0" * 4),  # a code byte read unsigned
        wire.MAGIC_BYTES + _entry(b"x", 0, [2], 4, b"\0" * 4),
        wire.MAGIC_BYTES + _entry(b"x", 0, [-1], 4, b"\0" * 4),
        wire.MAGIC_BYTES + _entry(b"x", 4, [0, 1 << 62, 4], 0),
    ],
)
def test_read_blob_and_decode_give_the_same_error(blob):
    assert _decoded_or_error(lambda: read_streamed(blob)) == _decoded_or_error(
        lambda: decode(bytearray(blob))
    )


def test_the_key_that_is_not_utf8_is_named():
    blob = wire.MAGIC_BYTES + _entry(b"ok", 7, [1], 1, b"\x01") + _entry(b"\xff\xfe", 7, [1], 1, b"\x01")
    message = "key b'\\xff\\xfe' is not UTF-8"
    assert _decoded_or_error(lambda: read_streamed(blob)) == message
    assert _decoded_or_error(lambda: decode(bytearray(blob))) == message


def test_a_long_key_that_is_not_utf8_is_named_by_its_first_40_bytes():
    raw = b"\xff" * 41
    blob = wire.MAGIC_BYTES + _entry(raw, 7, [1], 1, b"\x01")
    message = f"key {raw[:40]!r} is not UTF-8"
    assert _decoded_or_error(lambda: read_streamed(blob)) == message
    assert _decoded_or_error(lambda: decode(bytearray(blob))) == message


def test_a_key_of_the_most_bytes_allowed_is_read():
    key = "k" * wire.MAX_KEY_BYTES
    blob = encode({key: torch.ones(1)})
    assert list(read_streamed(blob)) == [key]
    assert list(decode(bytearray(blob))) == [key]


@pytest.mark.parametrize("count, allowed", [(16, True), (17, False)])
def test_max_entries_is_the_most_allowed(count, allowed):
    blob = wire.MAGIC_BYTES + b"".join(struct.pack("<I", 2) + b"%02d" % i + b"\x01" for i in range(count))
    for read in (
        lambda: decode(bytearray(blob), max_entries=16),
        lambda: read_streamed(blob, max_entries=16),
    ):
        got = _decoded_or_error(read)
        assert got == "more than 16 entries" if not allowed else len(got) == count


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64, torch.bfloat16, torch.bool])
def test_receive_pool_sizes_buffers_by_the_dtype(dtype):
    pool = ReceivePool(min_bytes=1024)
    tensor = pool.empty((4096,), dtype)
    assert tensor.shape == (4096,) and tensor.dtype == dtype
    tensor.fill_(1)
    del tensor
    assert pool.free_bytes == 4096 * torch.empty((), dtype=dtype).element_size()


def test_receive_pool_limits_are_inclusive_and_free_bytes_add_up():
    pool = ReceivePool(max_free_bytes=8192, min_bytes=4096)
    exactly_min = pool.empty((1024,), torch.float32)  # 4096 bytes: pooled
    another = pool.empty((1024,), torch.float32)
    del exactly_min
    assert pool.free_bytes == 4096
    del another  # 8192 in all: exactly the limit, kept
    assert pool.free_bytes == 8192
    below = pool.empty((1023,), torch.float32)
    del below
    assert pool.free_bytes == 8192
