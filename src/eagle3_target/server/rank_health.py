"""Rank 0's watch over a split replica: a runner whose ranks died says so by ``healthy()``.

Then /health and /readyz answer 503 (the service drains: no new work) for ``LINGER`` seconds, so a
probe sees why, and the process exits non-zero; its own ranks see it go and exit too (ranks.py).
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)

POLL_EVERY = 1.0
LINGER = 5.0  # seconds of 503 before the exit; with ranks.py's 10 s to call a rank dead, well under 30 s


async def until_unhealthy(server, poll_every: float = POLL_EVERY, linger: float = LINGER) -> None:
    """Return once the loaded runner reports ``healthy() is False`` and 503s have been served a while.
    A runner without ``healthy`` is always healthy."""
    while True:
        await asyncio.sleep(poll_every)
        healthy = getattr(server.service.model.runner, "healthy", None)
        if healthy is not None and not healthy():
            break
    log.error("a rank of this replica is gone: answering 503 for %.0fs, then exiting", linger)
    server.service.drain()
    server.metrics.ready.set(0)
    await asyncio.sleep(linger)
