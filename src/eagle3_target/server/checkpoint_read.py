"""A safetensors file read into private host memory, each tensor checked for NaN and infinities as it is read.

Read, not mapped as safetensors' own loader maps it: a mapped file rewritten in place (a trainer saving its next
checkpoint into the same folder) would change weights already checked, and one truncated or lost (a network
volume) would kill the process with SIGBUS. Read with ``preadv`` into fresh memory, a short read or an I/O error
is a refusal like any other. Each tensor comes in chunks of 1 MiB, each checked while it is still in the CPU's
cache, so the check adds almost no memory traffic. Tensors of 2 MiB or more land in memory advised for
transparent huge pages: faulting fresh memory in 4 KiB pages costs several times the read itself.
"""

from __future__ import annotations

import json
import math
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import InvalidInput

HEADER_LIMIT = 100 << 20  # safetensors' own bound on a header
CHUNK = 1 << 20
HUGE = 2 << 20

SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
NOT_FINITE = "it holds NaN or infinite values"
REDUCIBLE = (torch.float64, torch.float32, torch.float16, torch.bfloat16)  # the floating dtypes aminmax takes


@dataclass(frozen=True)
class Entry:
    """One tensor of a file: its safetensors dtype name, shape, and where its bytes are in the file."""

    kind: str
    shape: tuple[int, ...]
    start: int

    @property
    def dtype(self) -> torch.dtype:
        return SAFETENSORS_DTYPES[self.kind]


def read_header(path: Path, label: str) -> dict[str, Entry]:
    """The tensors ``path`` holds, by name, from its header; InvalidInput (``label``: the file as the user
    named it) when the header is not one safetensors writes or points outside the file."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < 8:
            raise corrupt(label, f"a file of {size} bytes holds no header")
        length = int.from_bytes(fh.read(8), "little")
        if not 0 < length <= min(HEADER_LIMIT, size - 8):
            raise corrupt(label, f"a header of {length} bytes in a file of {size}")
        try:
            doc = json.loads(fh.read(length))
        except (ValueError, RecursionError):
            doc = None
    if not isinstance(doc, dict):
        raise corrupt(label, "its header is not a JSON object")
    doc.pop("__metadata__", None)
    return {name: entry(name, spec, 8 + length, size, label) for name, spec in doc.items()}


def entry(name: str, spec, base: int, size: int, label: str) -> Entry:
    """One header entry, once its dtype is known and its bytes are exactly its shape's, inside the file."""
    if not isinstance(spec, dict) or spec.get("dtype") not in SAFETENSORS_DTYPES:
        raise corrupt(label, f"tensor {name!r} has no dtype safetensors knows")
    shape, offsets = spec.get("shape"), spec.get("data_offsets")
    ints = (
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in [*(shape or []), *(offsets or [])]
    )
    if not isinstance(shape, list) or not isinstance(offsets, list) or len(offsets) != 2 or not all(ints):
        raise corrupt(label, f"tensor {name!r} has no valid shape and data_offsets")
    begin, end = offsets
    nbytes = math.prod(shape) * SAFETENSORS_DTYPES[spec["dtype"]].itemsize
    if end - begin != nbytes or base + end > size:
        raise corrupt(
            label, f"tensor {name!r} of shape {shape} does not fit bytes {begin}..{end} of the file"
        )
    return Entry(spec["dtype"], tuple(shape), base + begin)


def read_tensor(fd: int, entry: Entry, block: tuple[slice, ...] | None, label: str) -> torch.Tensor:
    """``entry`` from the open file ``fd`` into memory of its own, checked: all of it, or only ``block`` (one
    slice per dimension, as a rank of a split replica holds it). A block of some columns reads the whole rows
    it spans and checks only its own columns, as the rank that holds the others checks theirs."""
    if not block:
        return read_bytes(fd, entry.start, entry.shape, entry.dtype, label)
    rows, rest = block[0], block[1:]
    row_bytes = math.prod(entry.shape[1:]) * entry.dtype.itemsize
    shape = (rows.stop - rows.start, *entry.shape[1:])
    offset = entry.start + rows.start * row_bytes
    if all(s.start == 0 and s.stop == n for s, n in zip(rest, entry.shape[1:], strict=True)):
        return read_bytes(fd, offset, shape, entry.dtype, label)
    rows_read = read_bytes(fd, offset, shape, entry.dtype, label, check=False)
    held = rows_read[(slice(None), *rest)].clone(memory_format=torch.contiguous_format)
    if held.is_floating_point() and not finite(held):
        raise corrupt(label, NOT_FINITE)
    return held


def read_bytes(
    fd: int, offset: int, shape: tuple[int, ...], dtype: torch.dtype, label: str, check: bool = True
) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` read from ``offset`` of ``fd``, a chunk at a time; with ``check``,
    each floating chunk checked finite as soon as it is in."""
    tensor = host_empty(shape, dtype)
    flat = tensor.view(-1)
    raw = memoryview(flat.view(torch.uint8).numpy())
    done = checked = 0
    while done < len(raw):
        got = os.preadv(fd, [raw[done : done + CHUNK]], offset + done)
        if got == 0:
            raise corrupt(label, "the file ends before this tensor does")
        done += got
        whole = done // dtype.itemsize
        if check and dtype.is_floating_point and not finite(flat[checked:whole]):
            raise corrupt(label, NOT_FINITE)
        checked = whole
    return tensor


def host_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Uninitialised host memory for a tensor, of its own; from 2 MiB on, advised for huge pages."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < HUGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(shape, dtype=dtype)
    area = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    area.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(area, dtype=torch.uint8).view(dtype).view(shape)


def finite(tensor: torch.Tensor) -> bool:
    """No NaN or infinity. A finite sum proves it (NaN and infinities propagate through addition), and a sum
    reads the tensor faster than any other reduction; only a sum that overflowed (or a bad tensor) is looked at
    again, its least and greatest value being finite exactly when every value is."""
    if tensor.numel() == 0:
        return True
    if tensor.dtype not in REDUCIBLE:  # float8, which neither sum nor aminmax takes: exact in bfloat16
        return finite(tensor.to(torch.bfloat16))
    if torch.isfinite(tensor.sum()):
        return True
    low, high = torch.aminmax(tensor)
    return bool(torch.isfinite(low) and torch.isfinite(high))


def corrupt(label: str, why: str) -> InvalidInput:
    return InvalidInput("source_corrupt", f"{label}: {why}")
