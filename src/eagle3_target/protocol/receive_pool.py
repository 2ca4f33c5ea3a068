"""Host memory for tensors received from the wire (wire.read_blob), reused instead of faulted in afresh."""

from __future__ import annotations

import math
import threading
import weakref

import numpy
import torch


class ReceivePool:
    """Host memory for received tensors, reused once every tensor viewing it is gone.

    A fresh 300 MB buffer costs about 75,000 page faults and its zeroing on first touch, more than
    receiving into it; a trainer receives same-sized replies batch after batch. Buffers of at least
    ``min_bytes`` are pooled, by exact size, up to ``max_free_bytes`` kept while unused.
    """

    def __init__(self, max_free_bytes: int = 2 << 30, min_bytes: int = 1 << 20):
        self.max_free_bytes, self.min_bytes = max_free_bytes, min_bytes
        self._free: dict[int, list[numpy.ndarray]] = {}
        self._free_bytes = 0
        self._lock = threading.RLock()  # a buffer may come back in any thread, even inside empty()

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised CPU tensor."""
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if nbytes < self.min_bytes:
            return torch.empty(shape, dtype=dtype)
        with self._lock:
            buffers = self._free.get(nbytes)
            buffer = buffers.pop() if buffers else None
            if buffer is not None:
                self._free_bytes -= nbytes
        if buffer is None:
            buffer = numpy.empty(nbytes, dtype=numpy.uint8)
        lease = buffer[:]  # torch holds this view until its storage dies; then the buffer comes back
        weakref.finalize(lease, self._give_back, buffer)
        return torch.from_numpy(lease).view(dtype).view(shape)

    @property
    def free_bytes(self) -> int:
        """Bytes held for reuse, not in any tensor."""
        return self._free_bytes

    def _give_back(self, buffer: numpy.ndarray) -> None:
        with self._lock:
            if self._free_bytes + buffer.nbytes <= self.max_free_bytes:
                self._free.setdefault(buffer.nbytes, []).append(buffer)
                self._free_bytes += buffer.nbytes


RECEIVE_POOL = ReceivePool()
