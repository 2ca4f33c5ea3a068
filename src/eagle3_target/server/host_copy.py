"""The copy of a /generate reply to host memory, overlapped with the next request's forward.

On a CUDA target the model thread only arranges the copy: page-locked buffers for the reply (a
copy into pageable memory is staged through a driver buffer at a fraction of the link's speed; the
buffers come from torch's caching host allocator, so a steady batch shape allocates none after the
first) and a side stream of the reply's device that waits for everything the compute stream has
queued so far. The request's turn at the model then ends and the next forward starts, while one
copy thread moves the reply on the side stream, one piece at a time (CHUNK_BYTES), and the
handler waits for it off the event loop. Replies are copied in the order they came.

Why pieces: the forward makes small device-to-host copies of its own (a mask check's ``.item()``,
say), and those wait behind whatever copies are already queued on the device. With a whole
1.25 GB reply queued at once, the next forward on an H200 took 88 ms instead of 67 (8 layers of
Llama-3.1-8B, 4 x 2048): the overlap gained nothing. Queued one piece at a time it took 71 ms.

The device tensors are held until their copy is done, so the caching allocator cannot hand their
memory to the next forward early. The copy is byte for byte. On a CPU target there is nothing to
copy: ``.cpu()`` is the tensor itself. Tests pass a fake ``Streams`` to drive this same path on
the CPU.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import torch

# One piece of a reply's copy: about 0.6 ms at the 55 GB/s of an H200's link, the longest a copy the
# forward makes itself waits; 8 and 128 MiB measured no better.
CHUNK_BYTES = 32 << 20


class Event(Protocol):
    def synchronize(self) -> None: ...


class Streams(Protocol):
    """What the copy asks of CUDA: arrange one tensor's copy to host memory (its host buffer is returned
    at once, filled later), then start the copies arranged so far; the Event says when they are done."""

    def copy(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def record(self) -> Event: ...


class CudaStreams:
    """One side stream per device and one copy thread: each reply is copied after the work the compute
    stream queued before it, one piece at a time (CHUNK_BYTES), replies in the order they came."""

    def __init__(self) -> None:
        self._side: dict[torch.device, torch.cuda.Stream] = {}
        self._queued: list[tuple[torch.Tensor, torch.Tensor, torch.cuda.Stream]] = []
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="host-copy")

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.is_cuda:
            return tensor
        side = self._side.get(tensor.device)
        if side is None:
            side = self._side[tensor.device] = torch.cuda.Stream(tensor.device)
        source = tensor.contiguous()
        side.wait_stream(torch.cuda.current_stream(tensor.device))  # after the projection that made it
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        self._queued.append((host, source, side))
        return host

    def record(self) -> Event:
        queued, self._queued = self._queued, []
        return _Done(self._thread.submit(_copy_in_pieces, queued))


def _copy_in_pieces(queued: list[tuple[torch.Tensor, torch.Tensor, torch.cuda.Stream]]) -> None:
    for host, source, side in queued:
        target, source = host.view(-1), source.view(-1)
        step = max(1, CHUNK_BYTES // source.element_size())
        with torch.cuda.stream(side):
            for start in range(0, source.numel(), step):
                target[start : start + step].copy_(source[start : start + step], non_blocking=True)
                # blocking=True: this thread sleeps instead of spinning a core while the piece moves
                done = torch.cuda.Event(blocking=True)
                done.record(side)
                done.synchronize()


class _Done:
    def __init__(self, future: Future):
        self.future = future

    def synchronize(self) -> None:
        self.future.result()


class PendingCopy:
    """A reply on its way to host memory; ``wait()`` (blocking) returns it there."""

    def __init__(self, host: dict[str, torch.Tensor], event: Event | None, sources: dict | None):
        self._host, self._event, self._sources = host, event, sources

    @property
    def done(self) -> bool:
        """True when ``wait()`` will not block (nothing was left to copy)."""
        return self._event is None

    def wait(self) -> dict[str, torch.Tensor]:
        if self._event is not None:
            self._event.synchronize()
            self._event = self._sources = None  # the device tensors may go now
        return self._host


class HostCopier:
    """Starts the copies of replies to host memory; ``streams`` overrides the CUDA streams (tests)."""

    def __init__(self, streams: Streams | None = None):
        self._streams = streams
        self._cuda: CudaStreams | None = None

    def start(self, tensors: dict[str, torch.Tensor]) -> PendingCopy:
        """On the model thread, after the reply was computed: enqueue its copy and return at once."""
        streams = self._streams
        if streams is None and any(t.is_cuda for t in tensors.values()):
            streams = self._cuda = self._cuda or CudaStreams()
        if streams is None:
            return PendingCopy({k: v.cpu() for k, v in tensors.items()}, None, None)
        host = {k: streams.copy(v) for k, v in tensors.items()}
        return PendingCopy(host, streams.record(), tensors)
