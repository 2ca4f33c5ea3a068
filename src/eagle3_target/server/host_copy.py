"""The copy of a /generate reply to host memory, overlapped with the next request's forward.

On a CUDA target the model thread only enqueues the copy: on a side stream of the reply's device,
ordered after everything the compute stream has queued so far, into page-locked memory (a copy
into pageable memory is staged through a driver buffer at a fraction of the link's speed; the
pinned buffers come from torch's caching host allocator, so a steady batch shape allocates none
after the first). The request's turn at the model then ends and the next forward starts while
the copy engine moves this reply; the handler waits for the copy's event off the event loop.

One side stream per device runs the copies in the order they were enqueued. The device tensors
are held until their copy is done, so the caching allocator cannot hand their memory to the next
forward early. The copy is byte for byte. On a CPU target there is nothing to copy: ``.cpu()``
is the tensor itself. Tests pass a fake ``Streams`` to drive this same path on the CPU.
"""

from __future__ import annotations

from typing import Protocol

import torch


class Event(Protocol):
    def synchronize(self) -> None: ...


class Streams(Protocol):
    """What the copy asks of CUDA: enqueue one copy to host memory, then mark the copies enqueued so far."""

    def copy(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def record(self) -> Event: ...


class CudaStreams:
    """One side stream per device; each copy waits for the work the compute stream queued before it."""

    def __init__(self) -> None:
        self._side: dict[torch.device, torch.cuda.Stream] = {}
        self._used: set[torch.device] = set()

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.is_cuda:
            return tensor
        side = self._side.get(tensor.device)
        if side is None:
            side = self._side[tensor.device] = torch.cuda.Stream(tensor.device)
        side.wait_stream(torch.cuda.current_stream(tensor.device))
        self._used.add(tensor.device)
        with torch.cuda.stream(side):
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            return host.copy_(tensor, non_blocking=True)

    def record(self) -> Event:
        # blocking=True: the waiting thread sleeps instead of spinning a core for the copy's length
        events = [self._side[d].record_event(torch.cuda.Event(blocking=True)) for d in self._used]
        self._used.clear()
        return _All(events)


class _All:
    def __init__(self, events: list[Event]):
        self.events = events

    def synchronize(self) -> None:
        for event in self.events:
            event.synchronize()


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
