"""A safetensors file read into private host memory, each tensor checked for NaN and infinities as it is read.

Read, not mapped as safetensors' own loader maps it: a mapped file rewritten in place (a trainer saving its next
checkpoint into the same folder) would change weights already checked, and one truncated or lost (a network
volume) would kill the process with SIGBUS. Read with ``preadv`` into fresh memory, a short read or an I/O error
is a refusal like any other. Each tensor comes in chunks of 1 MiB, each checked while it is still in the CPU's
cache, so the check adds almost no memory traffic; a few threads read pieces of a file at once. The tensors
of a file land in one arena of memory advised for transparent huge pages (``Arena``).
"""

from __future__ import annotations

import functools
import json
import math
import mmap
import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import InvalidInput

HEADER_LIMIT = 100 << 20  # safetensors' own bound on a header
CHUNK = 1 << 20
HUGE = 2 << 20  # a transparent huge page
PIECE = 8 << 20  # what one reader thread reads at a time
READERS = min(4, os.cpu_count() or 1)
ALIGN = 64

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
# What a process reads of a tensor: all of it, or a block (one slice per dimension, as a rank of a split
# replica holds it); and what it reads of a checkpoint, by tensor name (None: all of every tensor)
Block = tuple[slice, ...] | None
Parts = Mapping[str, Block]

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
    kind = spec.get("dtype") if isinstance(spec, dict) else None
    if not isinstance(kind, str) or kind not in SAFETENSORS_DTYPES:
        raise corrupt(label, f"tensor {name!r} has no dtype this server reads: {str(kind)[:20]!r}")
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


def read_file(
    path: Path, header: Mapping[str, Entry], parts: Parts | None, source: str
) -> dict[str, torch.Tensor]:
    """The tensors of ``path`` this process holds (all, or those of ``parts``, each only its block) by name,
    read and checked into one arena of the file's, by up to READERS threads a piece at a time: one thread
    reading a page-cache-warm checkpoint spends as long faulting in fresh memory as copying into it. The
    first refusal in file order is raised once the pieces already running end; the later ones never start."""
    wanted = [
        (name, entry, None if parts is None else parts[name])
        for name, entry in sorted(header.items(), key=lambda item: item[1].start)
        if parts is None or name in parts  # else another rank's
    ]
    shapes = {name: (held_shape(entry, block), entry.dtype) for name, entry, block in wanted}
    arena = Arena(Arena.size(shapes.values()))
    held = {name: arena.take(*shape) for name, shape in shapes.items()}
    with open(path, "rb", buffering=0) as fh, ThreadPoolExecutor(READERS, "refresh-read") as pool:
        run = Pieces()
        jobs = [
            pool.submit(run, index, piece)
            for index, piece in enumerate(
                piece
                for name, entry, block in wanted
                for piece in pieces(fh.fileno(), entry, block, f"{source}: {name}", held[name])
            )
        ]
        for job in jobs:
            job.result()
    return held


class Pieces:
    """Runs a file's pieces, numbered in file order, so that none after the earliest refusal starts. The
    reader that fails decides, not the thread waiting on the results: a reader left to take the next piece
    before that thread wakes would read on. A piece before the refusal still runs, so the refusal raised
    is the first in file order."""

    def __init__(self):
        self.refused_at = math.inf

    def __call__(self, index: int, piece: Callable[[], object]) -> None:
        if index > self.refused_at:
            return
        try:
            piece()
        except BaseException:
            self.refused_at = min(self.refused_at, index)  # two at once may keep the later: still a refusal
            raise


def held_shape(entry: Entry, block: Block) -> tuple[int, ...]:
    """The shape of what a process holds of ``entry``: all of it, or ``block`` of it."""
    return entry.shape if not block else tuple(s.stop - s.start for s in block)


def pieces(fd: int, entry: Entry, block: Block, label: str, into: torch.Tensor) -> list[Callable[[], object]]:
    """What reads ``entry`` from the open file ``fd`` into ``into`` and checks it, as pieces that may run at
    once: all of it, or ``block`` (one slice per dimension, as a rank of a split replica holds it). A block of
    some columns is one piece, which reads the whole rows it spans and checks only its own columns, as the rank
    that holds the others checks theirs."""
    offset = entry.start
    if block:
        offset += block[0].start * nbytes(entry.shape[1:], entry.dtype)
        if not all(s.start == 0 and s.stop == n for s, n in zip(block[1:], entry.shape[1:], strict=True)):
            return [functools.partial(read_columns, fd, offset, entry, block, label, into)]
    flat, step = into.view(-1), PIECE // into.itemsize
    return [
        functools.partial(read_into, fd, offset + start * into.itemsize, flat[start : start + step], label)
        for start in range(0, flat.numel(), step)
    ]


def read_columns(
    fd: int, offset: int, entry: Entry, block: tuple[slice, ...], label: str, into: torch.Tensor
):
    spanned = (block[0].stop - block[0].start, *entry.shape[1:])
    rows = Arena(nbytes(spanned, entry.dtype)).take(spanned, entry.dtype)
    read_into(fd, offset, rows, label, check=False)
    into.copy_(rows[(slice(None), *block[1:])])
    if into.is_floating_point() and not finite(into):
        raise corrupt(label, NOT_FINITE)


def read_into(fd: int, offset: int, tensor: torch.Tensor, label: str, check: bool = True) -> torch.Tensor:
    """``tensor`` (contiguous) filled from ``offset`` of ``fd``, a chunk at a time; with ``check``, each
    floating chunk checked finite as soon as it is in."""
    flat = tensor.view(-1)
    raw = memoryview(flat.view(torch.uint8).numpy())
    done = checked = 0
    while done < len(raw):
        got = os.preadv(fd, [raw[done : done + CHUNK]], offset + done)
        if got == 0:
            raise corrupt(label, "the file ends before this tensor does")
        done += got
        whole = done // tensor.itemsize
        if check and tensor.is_floating_point() and not finite(flat[checked:whole]):
            raise corrupt(label, NOT_FINITE)
        checked = whole
    return tensor


def nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


class Arena:
    """Host memory of the process's own for the tensors one file gives it: one anonymous private mapping that
    begins on a 2 MiB boundary, advised for transparent huge pages, the tensors carved from it in turn.
    Faulting fresh memory in 4 KiB pages costs several times the read itself, and tensors of a few MiB
    mapped apart are too small or too unaligned for huge pages. The mapping lives while any tensor carved
    from it does (each holds its storage): once they serve, until the next refresh replaces them."""

    def __init__(self, size: int):
        area = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            area.madvise(mmap.MADV_HUGEPAGE)
        whole = torch.frombuffer(area, dtype=torch.uint8)
        begin = -whole.data_ptr() % HUGE  # untouched, the pages before it are never faulted in
        self.free, self.used = whole[begin : begin + size], 0

    @staticmethod
    def size(shapes: Iterable[tuple[tuple[int, ...], torch.dtype]]) -> int:
        """The bytes an arena needs for tensors of these shapes and dtypes."""
        return sum(aligned(nbytes(shape, dtype)) for shape, dtype in shapes)

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The next uninitialised tensor of ``shape`` and ``dtype``."""
        size = nbytes(shape, dtype)
        if self.used + size > len(self.free):
            raise ValueError(f"an arena of {len(self.free)} bytes has no room for {size} more")
        piece = self.free[self.used : self.used + size]
        self.used += aligned(size)
        return piece.view(dtype).view(shape)


def aligned(size: int) -> int:
    """``size`` rounded up to a cache line, where every tensor of an arena begins."""
    return -(-size // ALIGN) * ALIGN


def finite(tensor: torch.Tensor) -> bool:
    """No NaN or infinity. A finite sum proves it (NaN and infinities propagate through addition), and a sum
    reads the tensor faster than any other reduction; only a sum that overflowed (or a bad tensor) is looked at
    again, its least and greatest value being finite exactly when every value is."""
    if tensor.numel() == 0:
        return True
    if tensor.dtype not in REDUCIBLE:  # float8, which neither sum nor aminmax takes: exact in bfloat16
        return finite(tensor.to(torch.bfloat16))
    if math.isfinite(tensor.sum().item()):  # a Python float: half the cost of a tensor op on 1 MiB chunks
        return True
    low, high = torch.aminmax(tensor)
    return bool(torch.isfinite(low) and torch.isfinite(high))


def corrupt(label: str, why: str) -> InvalidInput:
    return InvalidInput("source_corrupt", f"{label}: {why}")
