"""The lm_head rows of the draft vocabulary, for the "hidden" encoding: fetched once per mapping."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import torch


class HeadRowsCache:
    def __init__(self):
        self._rows: tuple[bytes, torch.Tensor] | None = None  # (the vocab blob, its rows)
        self._lock = asyncio.Lock()  # one fetch at a time: concurrent batches share it

    async def get(self, vocab_blob: bytes, fetch: Callable[[], Awaitable[torch.Tensor]]) -> torch.Tensor:
        """The rows of ``vocab_blob``'s mapping, fetched with ``fetch`` the first time it is asked for."""
        async with self._lock:
            if self._rows is None or self._rows[0] is not vocab_blob:
                self._rows = (vocab_blob, await fetch())
            return self._rows[1]
