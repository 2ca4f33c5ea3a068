"""The pool's members and the state the parts of membership (membership.py) share: who is in the pool, in
which state, why the others were refused, and the condition dispatch waits on for a change."""

from __future__ import annotations

import asyncio
import enum
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from eagle3_target.protocol.model_info import ModelInfo

from .agreement import Agreement
from .connection import ServerConnection
from .endpoints import EndpointResolver
from .identity import FleetModel
from .options import PoolOptions


class MemberState(enum.Enum):
    JOINING = "joining"
    HEALTHY = "healthy"
    QUARANTINED = "quarantined"
    DRAINING = "draining"
    REFUSED = "refused"


@dataclass
class Member:
    conn: ServerConnection
    state: MemberState = MemberState.JOINING
    in_flight: int = 0
    last_error: str = ""
    refusal: BaseException | None = None
    agreement: Agreement | None = None  # set at each admission, whole
    probed_info: ModelInfo | None = None  # /model_info read before the first join, used by it
    strikes: int = 0  # quarantines since its last good answer: each quadruples the wait before it rejoins
    rest_until: float = 0.0  # loop time before which it takes no request (it answered 429 + Retry-After)
    version: str | None = None  # the target version it serves, as last seen (versions.py)
    refreshed_at: float | None = None  # when that version began serving there; None: its start-up weights
    tasks: set[asyncio.Task] = field(default_factory=set)

    @property
    def url(self) -> str:
        return self.conn.url


class Roster:
    """The members by URL, the fleet's model, the vocab mapping every member gets, and change notification."""

    def __init__(
        self,
        resolver: EndpointResolver,
        connect: Callable[..., ServerConnection],
        options: PoolOptions,
    ):
        self.resolver, self.connect, self.options = resolver, connect, options
        self.members: dict[str, Member] = {}
        self.model = FleetModel()
        self.refused: dict[str, str] = {}  # url -> why
        self.vocab_blob: bytes | None = None  # sent to every member as it joins
        self.changed = asyncio.Condition()  # notified when membership or load changes
        self.resolve_now = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()

    # -- views -----------------------------------------------------------------------------

    def healthy(self) -> list[Member]:
        # list() copies in one step, so the trainer thread can call this while the loop changes members.
        return [m for m in list(self.members.values()) if m.state == MemberState.HEALTHY]

    def describe(self) -> str:
        parts = [
            f"{m.url} {m.state.value}" + (f" ({m.last_error})" if m.last_error else "")
            for m in self.members.values()
        ]
        parts += [f"{url} refused ({why})" for url, why in self.refused.items() if url not in self.members]
        return "; ".join(parts) or "no servers"

    # -- change notification ---------------------------------------------------------------

    async def wait_changed(self, timeout: float) -> bool:
        """Wait (holding ``changed``) until membership or load changes; False on timeout."""
        try:
            await asyncio.wait_for(self.changed.wait(), max(0.0, timeout))
            return True
        except TimeoutError:
            return False

    def notify(self) -> None:
        async def wake():
            async with self.changed:
                self.changed.notify_all()

        self.spawn(wake())

    def spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _start_member_task(self, member: Member, coro) -> None:
        task = asyncio.create_task(coro)
        member.tasks.add(task)
        task.add_done_callback(member.tasks.discard)


def short(error: BaseException) -> str:
    """One line saying why a server failed; a refused or unresolvable address says so in words."""
    if isinstance(error, aiohttp.ClientConnectorError):
        code, words = error.os_error.errno, error.os_error.strerror
        why = os.strerror(code) if code and code > 0 else words or str(error.os_error)
        return f"cannot connect to {error.host}:{error.port}: {why}"
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return text if len(text) <= 300 else text[:300] + "..."  # a server chooses these words: keep them short
