"""The future-like handles the trainer holds while a batch is on its way (NeMo's prefetch loop calls
``done``, ``cancel`` and ``result(timeout)`` on them)."""

from __future__ import annotations

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
