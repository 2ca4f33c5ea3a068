"""NeMo's binary wire format: a dict of tensors (or None) in one byte buffer.

Layout (little-endian): u32 magic, then per entry u32 key_len, key, u8 flags
(bit 0 = None), and for tensors u8 dtype code, u8 ndim, ndim x i64 shape,
u64 nbytes and the raw C-contiguous bytes.

Encoding yields the header bytes and zero-copy views of the tensor storage, so
a 300 MB response is never joined into one buffer. Decoding validates every
length against the buffer before touching it and returns views into it: a
hostile buffer can make it raise ``WireError`` but never allocate or crash.
``read_blob`` decodes from a stream instead: each tensor is allocated from its
header (never beyond the declared body size) and its bytes are read straight
into that storage, so a receiver holds the reply once and never as one buffer.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Mapping
from typing import Protocol

import torch

from .receive_pool import RECEIVE_POOL

MAGIC = 0x4E4D4554
MAGIC_BYTES = struct.pack("<I", MAGIC)

DTYPE_TO_CODE: dict[torch.dtype, int] = {
    torch.float32: 0,
    torch.float64: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.int64: 4,
    torch.int32: 5,
    torch.int16: 6,
    torch.int8: 7,
    torch.uint8: 8,
    torch.bool: 9,
}
CODE_TO_DTYPE: dict[int, torch.dtype] = {code: dtype for dtype, code in DTYPE_TO_CODE.items()}

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_ENTRY_HEAD = struct.Struct("<BBB")  # flags, dtype code, ndim
_FLAG_NONE = 1
# Every reader's bounds on per-entry work: no blob we speak has more than a handful of entries or a
# key longer than a few words, so a blob of millions of tiny entries or a 4 GB key is refused early.
MAX_ENTRIES = 64
MAX_KEY_BYTES = 256

TensorDict = Mapping[str, torch.Tensor | None]


class WireError(ValueError):
    """A buffer that is not a valid wire blob, or a tensor that cannot be encoded."""


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor, without copying."""
    flat = tensor.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy())


def _prepare(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.device.type != "cpu":
        raise WireError(f"cannot encode a {tensor.device.type} tensor; move it to the CPU first")
    if tensor.dtype not in DTYPE_TO_CODE:
        raise WireError(f"dtype {tensor.dtype} has no wire code")
    return tensor.contiguous()


def _entry_header(key: str, tensor: torch.Tensor | None) -> bytes:
    name = key.encode("utf-8")
    head = _U32.pack(len(name)) + name
    if tensor is None:
        return head + bytes([_FLAG_NONE])
    shape = tensor.shape
    return (
        head
        + _ENTRY_HEAD.pack(0, DTYPE_TO_CODE[tensor.dtype], len(shape))
        + struct.pack(f"<{len(shape)}q", *shape)
        + _U64.pack(tensor.numel() * tensor.element_size())
    )


class EncodedBlob:
    """A wire blob as a sequence of buffers: headers and views of tensor storage.

    ``nbytes`` is known up front (for Content-Length); ``chunks()`` yields the
    pieces in order; ``tobytes()`` joins them, for small blobs and tests.
    """

    def __init__(self, tensors: TensorDict):
        self._parts: list[bytes | memoryview] = [MAGIC_BYTES]
        self._keep: list[torch.Tensor] = []  # keeps contiguous copies alive
        for key, value in tensors.items():
            tensor = None if value is None else _prepare(value)
            self._parts.append(_entry_header(key, tensor))
            if tensor is not None and tensor.numel():
                self._keep.append(tensor)
                self._parts.append(tensor_bytes(tensor))
        self.nbytes = sum(len(p) for p in self._parts)

    def chunks(self, max_chunk: int = 1 << 22) -> Iterator[bytes | memoryview]:
        """Yield the blob in pieces of at most ``max_chunk`` bytes (tensor data is sliced, not copied)."""
        for part in self._parts:
            if len(part) <= max_chunk:
                yield part
                continue
            view = memoryview(part)
            for start in range(0, len(view), max_chunk):
                yield view[start : start + max_chunk]

    def tobytes(self) -> bytes:
        return b"".join(self._parts)


def encode(tensors: TensorDict) -> bytes:
    """Encode a dict of tensors (or None) into one bytes object."""
    return EncodedBlob(tensors).tobytes()


class _Reader:
    def __init__(self, buf: memoryview):
        self.buf = buf
        self.pos = 0

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or n > len(self.buf) - self.pos:
            raise WireError(
                f"truncated blob: {what} needs {n} bytes at offset {self.pos}, "
                f"{len(self.buf) - self.pos} left"
            )
        view = self.buf[self.pos : self.pos + n]
        self.pos += n
        return view

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u32(self, what: str) -> int:
        return _U32.unpack(self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return _U64.unpack(self.take(8, what))[0]


def decode(
    buf: bytes | bytearray | memoryview, max_entries: int = MAX_ENTRIES
) -> dict[str, torch.Tensor | None]:
    """Decode a wire blob into tensors that view ``buf`` (zero-copy).

    Pass a writable buffer (bytearray) to get writable tensors; read-only
    buffers (bytes) are copied per tensor because torch cannot view them safely.
    ``max_entries`` bounds the per-entry work a blob of many tiny entries can cause; keys longer
    than MAX_KEY_BYTES and repeated keys are refused.
    """
    view = memoryview(buf).cast("B")
    reader = _Reader(view)
    magic = reader.u32("magic")
    if magic != MAGIC:
        raise WireError(f"bad magic 0x{magic:08X}, expected 0x{MAGIC:08X}")
    out: dict[str, torch.Tensor | None] = {}
    entries = 0
    while reader.pos < len(view):
        entries += 1
        _check_entries(entries, max_entries)
        key_len = _key_length(reader.u32("key length"))
        key = _key(bytes(reader.take(key_len, "key")), out)
        flags = reader.u8(f"flags of {key!r}")
        if flags & _FLAG_NONE:
            out[key] = None
            continue
        dtype = _dtype(key, reader.u8(f"dtype of {key!r}"))
        ndim = reader.u8(f"ndim of {key!r}")
        shape = struct.unpack(f"<{ndim}q", reader.take(8 * ndim, f"shape of {key!r}"))
        nbytes = _checked_nbytes(key, dtype, shape, reader.u64(f"nbytes of {key!r}"))
        data = reader.take(nbytes, f"data of {key!r}")
        out[key] = _view_tensor(data, dtype, shape)
    return out


def _view_tensor(data: memoryview, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    try:
        if len(data) == 0:  # torch refuses shapes like [0, 2**62, 4]: strides overflow int64
            return torch.empty(shape, dtype=dtype)
        if data.readonly:
            data = memoryview(bytearray(data))
        return torch.frombuffer(data, dtype=dtype).view(shape)
    except RuntimeError as exc:
        raise WireError(f"shape {list(shape)} is not a valid {dtype} tensor: {exc}") from None


def _check_entries(entries: int, max_entries: int) -> None:
    if entries > max_entries:
        raise WireError(f"more than {max_entries} entries")


def _key_length(n: int) -> int:
    if n > MAX_KEY_BYTES:
        raise WireError(f"a key of {n} bytes (at most {MAX_KEY_BYTES})")
    return n


def _key(raw: bytes, seen: Mapping[str, object]) -> str:
    try:
        key = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise WireError(f"key {raw[:40]!r} is not UTF-8") from None
    if key in seen:
        raise WireError(f"key {key!r} appears twice")
    return key


def _dtype(key: str, code: int) -> torch.dtype:
    dtype = CODE_TO_DTYPE.get(code)
    if dtype is None:
        raise WireError(f"unknown dtype code {code} for {key!r}")
    return dtype


def _checked_nbytes(key: str, dtype: torch.dtype, shape: tuple[int, ...], nbytes: int) -> int:
    if any(d < 0 for d in shape):
        raise WireError(f"negative dimension in shape {list(shape)} of {key!r}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    expected = math.prod(shape) * itemsize
    if nbytes != expected:
        raise WireError(
            f"{key!r}: nbytes {nbytes} disagrees with shape {list(shape)} x {itemsize} B = {expected}"
        )
    return nbytes


# -- decoding from a stream into preallocated tensors ------------------------------------------


class ByteSource(Protocol):
    """An async byte stream, such as an HTTP body."""

    async def readinto(self, view: memoryview) -> None:
        """Fill ``view`` completely; raise if the stream ends first."""


class _StreamReader:
    """Reads fields from a ByteSource, never past ``size`` bytes."""

    def __init__(self, source: ByteSource, size: int):
        self.source, self.size, self.pos = source, size, 0

    def check(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise WireError(
                f"truncated blob: {what} needs {n} bytes at offset {self.pos}, {self.size - self.pos} left"
            )

    async def into(self, view: memoryview, what: str) -> None:
        self.check(len(view), what)
        await self.source.readinto(view)
        self.pos += len(view)

    async def take(self, n: int, what: str) -> bytes:
        self.check(n, what)  # before allocating: a length is only a claim
        buf = bytearray(n)
        await self.into(memoryview(buf), what)
        return bytes(buf)

    async def u8(self, what: str) -> int:
        return (await self.take(1, what))[0]

    async def u32(self, what: str) -> int:
        return _U32.unpack(await self.take(4, what))[0]

    async def u64(self, what: str) -> int:
        return _U64.unpack(await self.take(8, what))[0]


async def read_blob(
    source: ByteSource, size: int, max_entries: int = MAX_ENTRIES, pin_memory: bool = False
) -> dict[str, torch.Tensor | None]:
    """Decode a ``size``-byte wire blob from ``source``, reading each tensor's bytes straight into its own
    storage (pinned for a copy to CUDA, else from ``RECEIVE_POOL``). Checks as ``decode`` does; a tensor
    larger than what is left raises before it is allocated."""
    reader = _StreamReader(source, size)
    magic = await reader.u32("magic")
    if magic != MAGIC:
        raise WireError(f"bad magic 0x{magic:08X}, expected 0x{MAGIC:08X}")
    out: dict[str, torch.Tensor | None] = {}
    entries = 0
    while reader.pos < size:
        entries += 1
        _check_entries(entries, max_entries)
        key_len = _key_length(await reader.u32("key length"))
        key = _key(await reader.take(key_len, "key"), out)
        if await reader.u8(f"flags of {key!r}") & _FLAG_NONE:
            out[key] = None
            continue
        dtype = _dtype(key, await reader.u8(f"dtype of {key!r}"))
        ndim = await reader.u8(f"ndim of {key!r}")
        shape = struct.unpack(f"<{ndim}q", await reader.take(8 * ndim, f"shape of {key!r}"))
        nbytes = _checked_nbytes(key, dtype, shape, await reader.u64(f"nbytes of {key!r}"))
        reader.check(nbytes, f"data of {key!r}")
        try:
            if pin_memory:  # torch's pinned allocator caches and reuses its blocks itself
                tensor = torch.empty(shape, dtype=dtype, pin_memory=True)
            else:
                tensor = RECEIVE_POOL.empty(shape, dtype)
        except RuntimeError as exc:  # shapes like [0, 2**62, 4]: strides overflow int64
            raise WireError(f"shape {list(shape)} is not a valid {dtype} tensor: {exc}") from None
        if nbytes:
            await reader.into(tensor_bytes(tensor), f"data of {key!r}")
        out[key] = tensor
    return out
