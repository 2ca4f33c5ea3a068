"""The lm_head rows of the draft vocabulary, for the "hidden" encoding: fetched once per mapping and target
version (a refresh changes them)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import torch


class HeadRowsCache:
    def __init__(self):
        self._rows: tuple[tuple[bytes | None, str | None], torch.Tensor] | None = None  # (key, its rows)
        self._lock = asyncio.Lock()  # one fetch at a time: concurrent batches share it

    async def get(
        self, key: tuple[bytes | None, str | None], fetch: Callable[[], Awaitable[torch.Tensor]]
    ) -> torch.Tensor:
        """The rows of ``key`` (the vocab blob and the target version), fetched with ``fetch`` the first time
        it is asked for."""
        async with self._lock:
            if self._rows is None or self._rows[0][0] is not key[0] or self._rows[0][1] != key[1]:
                self._rows = (key, await fetch())
            return self._rows[1]
