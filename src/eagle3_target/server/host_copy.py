"""A /generate reply's projection and its copy to host memory, overlapped with the next request's forward.

On a CUDA target the model thread runs only the forward: it hands the reply's projection (the
encoding, e.g. the draft-vocabulary softmax; or a feature reply's assembly) to a side stream of the
reply's device, ordered after everything the compute stream has queued so far, and its turn at the
model ends, so the next forward starts at once. One copy thread then runs each projection on the
side stream and moves its tensors to page-locked host buffers, one piece at a time (CHUNK_BYTES),
and the handler waits for it off the event loop. Replies are projected and copied in the order
they came; the kernels and their inputs are those of the compute stream, so the bytes are the same.
Page-locked, because a copy into pageable memory is staged through a driver buffer at a fraction of
the link's speed; the buffers come from torch's caching host allocator, so a steady batch shape
allocates none after the first.

Why pieces: the forward makes small device-to-host copies of its own (a mask check's ``.item()``,
say), and those wait behind whatever copies are already queued on the device. With a whole
1.25 GB reply queued at once, the next forward on an H200 took 88 ms instead of 67 (8 layers of
Llama-3.1-8B, 4 x 2048): the overlap gained nothing. Queued one piece at a time it took 71 ms.

The forward's tensors are held until the projection and the copy are done, so the caching allocator
cannot hand their memory to the next forward early. On a CPU target the projection runs at once, on
the model thread, and there is nothing to copy: ``.cpu()`` is the tensor itself. Tests pass a fake
``Streams`` to drive this same path on the CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import torch

# One piece of a reply's copy: about 0.6 ms at the 55 GB/s of an H200's link, the longest a copy the
# forward makes itself waits; 8 and 128 MiB measured no better.
CHUNK_BYTES = 32 << 20


Reply = dict[str, torch.Tensor]
Projection = Callable[[], Reply]  # the reply's tensors on the device, from the forward's


class Done(Protocol):
    def result(self) -> Reply: ...


class Streams(Protocol):
    """What the overlap asks of CUDA: run ``project`` after the work the compute stream of ``device`` has
    queued so far, and copy what it returns to host memory; ``result()`` gives the host copies. Calls
    complete in the order they were made."""

    def run(self, project: Projection, device: torch.device) -> Done: ...


class CudaStreams:
    """One side stream per device and one copy thread: each reply is projected on the side stream after the
    work the compute stream queued before it, then copied one piece at a time (CHUNK_BYTES), in order."""

    def __init__(self) -> None:
        self._side: dict[torch.device, torch.cuda.Stream] = {}
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="host-copy")

    def run(self, project: Projection, device: torch.device) -> Done:
        side = self._side.get(device)
        if side is None:
            side = self._side[device] = torch.cuda.Stream(device)
        # Here on the model thread: the side stream waits for this forward, not for the next one.
        side.wait_stream(torch.cuda.current_stream(device))
        return self._thread.submit(_project_and_copy, project, side)


def _project_and_copy(project: Projection, side: torch.cuda.Stream) -> Reply:
    with torch.cuda.stream(side):  # the current stream is per thread: the copy thread's is the side one
        try:
            reply = project()
            host = {}
            for key, tensor in reply.items():
                if not tensor.is_cuda:
                    host[key] = tensor
                    continue
                source = tensor.contiguous()
                host[key] = torch.empty(source.shape, dtype=source.dtype, pin_memory=True)
                _copy_in_pieces(host[key].view(-1), source.view(-1), side)
        finally:
            # the device tensors may go when this returns (or raises): nothing queued still reads them
            side.synchronize()
    return host


def _copy_in_pieces(target: torch.Tensor, source: torch.Tensor, side: torch.cuda.Stream) -> None:
    step = max(1, CHUNK_BYTES // source.element_size())
    for start in range(0, source.numel(), step):
        target[start : start + step].copy_(source[start : start + step], non_blocking=True)
        # blocking=True: this thread sleeps instead of spinning a core while the piece moves
        done = torch.cuda.Event(blocking=True)
        done.record(side)
        done.synchronize()


class PendingCopy:
    """A reply on its way to host memory; ``wait()`` (blocking) returns it there. ``projected_at``: the
    perf_counter() at which its projection ended (set where it ran)."""

    def __init__(self) -> None:
        self._host: Reply | None = None
        self._done: Done | None = None
        self.projected_at: float | None = None

    @property
    def done(self) -> bool:
        """True when ``wait()`` will not block (the projection and the copy ran at once)."""
        return self._done is None

    def wait(self) -> Reply:
        if self._done is not None:
            self._host, self._done = self._done.result(), None  # the forward's tensors may go now
        return self._host


class HostCopier:
    """Starts the projections and copies of replies; ``streams`` overrides the CUDA streams (tests)."""

    def __init__(self, streams: Streams | None = None):
        self._streams = streams
        self._cuda: CudaStreams | None = None

    def start(self, project: Projection, device: torch.device | str) -> PendingCopy:
        """On the model thread, right after the forward on ``device``: arrange the reply's projection
        and copy, and return at once (on a CPU target without ``streams``, with both done)."""
        pending, device = PendingCopy(), torch.device(device)
        streams = self._streams
        if streams is None and device.type == "cuda":
            streams = self._cuda = self._cuda or CudaStreams()

        def projected() -> Reply:
            with torch.inference_mode():  # as on the model thread, wherever it runs
                reply = project()
            pending.projected_at = time.perf_counter()
            return reply

        if streams is None:
            pending._host = {k: v.cpu() for k, v in projected().items()}
        else:
            pending._done = streams.run(projected, device)
        return pending
