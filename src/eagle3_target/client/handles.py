"""The future-like handles the trainer holds while a batch is on its way (NeMo's prefetch loop calls
``done``, ``cancel`` and ``result(timeout)`` on them)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any


class PendingHandle:
    """A pending reply: ``done`` and ``cancel`` ask what it waits on; a subclass defines ``result``."""

    def __init__(self, pending: Any):
        self._pending = pending  # a concurrent.futures.Future, or another handle

    def done(self) -> bool:
        return self._pending.done()

    def cancel(self) -> bool:
        return self._pending.cancel()


class MappedHandle(PendingHandle):
    """Another handle whose result goes through ``finish``: how a NeMo adapter hands back its own batch."""

    def __init__(self, handle: PendingHandle, finish: Callable[[Any], Any]):
        super().__init__(handle)
        self._finish = finish

    def result(self, timeout: float | None = None) -> Any:
        return self._finish(self._pending.result(timeout))


class FreshReply:
    """A reply on its way (a future of ``submit()``) that is asked again if, by the time the trainer takes
    it, the session wants another target version than the one that computed it (a prefetched batch from
    before a refresh or a pin): every batch taken comes from the version wanted when it is taken."""

    def __init__(
        self, submit: Callable[[], concurrent.futures.Future], current: Callable[[str | None], bool]
    ):
        self._submit, self._current = submit, current
        self._future = submit()

    def done(self) -> bool:
        return self._future.done()

    def cancel(self) -> bool:
        return self._future.cancel()

    def result(self, timeout: float | None = None) -> Any:
        reply = self._future.result(timeout)
        while not self._current(reply.target_version):
            self._future = self._submit()
            reply = self._future.result(timeout)
        return reply
