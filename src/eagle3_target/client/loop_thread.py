"""The client's own event loop on a daemon thread: the trainer's thread submits coroutines to it and waits on
futures, so a plain training loop never sees asyncio."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading


class LoopThread:
    """One event loop, run on its own thread; what is still pending is cancelled at close."""

    def __init__(self, name: str = "eagle3-target-client"):
        self.closed = False
        self._pending: set[concurrent.futures.Future] = set()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro) -> concurrent.futures.Future:
        if self.closed:
            coro.close()
            raise RuntimeError("the target backend is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        return future

    def call(self, coro):
        """Run ``coro`` on the loop and wait for its result on this thread."""
        return self.submit(coro).result()

    def close(self, last=None) -> None:
        """Cancel what is pending, run the coroutine function ``last`` to its end, stop the loop and its thread."""
        if self.closed:
            return
        self.closed = True
        for future in list(self._pending):
            future.cancel()
        if last is not None:
            asyncio.run_coroutine_threadsafe(last(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()
