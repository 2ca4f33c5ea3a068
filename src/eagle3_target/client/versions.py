"""Which target version a session trains on: a label it pins, or the newest the fleet serves.

Each member's version is what its /model_info said at admission, corrected by every reply's
X-Eagle3-Target-Version. A reply whose header names a version not known for its member makes the pool read
that member's /model_info again (when it was refreshed orders versions), so a refresh is seen at its first
reply. Dispatch sends requests only to members at the wanted version, and a reply computed by other weights
is refused (StaleVersion) and asked again elsewhere: every batch comes from the wanted version, whole. Every
healthy member is also asked its /model_info every ``version_poll_interval`` seconds, since members at other
versions get no requests: a refresh is seen within that, with or without traffic. A batch prefetched before
is asked again when it is taken (handles.FreshReply).

The newest version is the one whose refresh began serving last of all the session has seen (``refreshed_at``,
each server's own clock: a fleet's refreshes of one version land within seconds, minutes apart from the next
one's). Start-up weights rank below any refresh, so a replica restarted on its old checkpoint never counts as
newer; before any refresh, the newest is the version most healthy members serve.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Iterable

from eagle3_target.protocol.model_info import NEWEST, ModelInfo, check_version_choice

from .members import Member, Roster

log = logging.getLogger(__package__ + ".membership")


class StaleVersion(Exception):
    """A reply computed by other weights than the session wants: asked again elsewhere, nobody's fault."""


def most_served(members: Iterable[Member]) -> str | None:
    """The version most of ``members`` serve (ties: by name); None where none reports one."""
    counts = collections.Counter(m.version for m in members if m.version is not None)
    return min(counts, key=lambda v: (-counts[v], v)) if counts else None


class Versions(Roster):
    """The wanted version, each member's, and what a reply's version header tells about them."""

    pinned: str | None = None  # a label pinned while running (pin()); None: the options' choice
    latest_refresh: tuple[float, str] | None = None  # (refreshed_at, version) of the latest refresh seen

    def wanted_version(self) -> str | None:
        """The label requests must be served from; None where no member reports one (a stock NeMo fleet).
        The newest never goes back: with the members at the latest refresh gone, dispatch waits for them."""
        choice = self.pinned or self.options.target_version
        if choice != NEWEST:
            return choice
        return self.latest_refresh[1] if self.latest_refresh else most_served(self.healthy())

    def is_wanted(self, version: str | None) -> bool:
        """Whether a reply of ``version`` may be trained on now."""
        wanted = self.wanted_version()
        return wanted is None or version == wanted

    def at_wanted_version(self, member: Member) -> bool:
        return self.is_wanted(member.version)

    def pin(self, version: str) -> None:
        """Train on ``version`` from now on (or the newest again, with ``newest``)."""
        choice = check_version_choice(version)
        self.pinned = None if choice == NEWEST else choice
        self.notify()

    def learn(self, member: Member, info: ModelInfo) -> None:
        """What ``member``'s /model_info says of its version."""
        if info.refreshed_at is not None and info.target_version is not None:
            seen = (info.refreshed_at, info.target_version)
            self.latest_refresh = max(seen, self.latest_refresh or seen)
        if (info.target_version, info.refreshed_at) != (member.version, member.refreshed_at):
            if member.version is not None:
                log.info("%s serves target version %s", member.url, info.target_version)
            member.version, member.refreshed_at = info.target_version, info.refreshed_at
            self.notify()

    async def check_version(self, member: Member, version: str | None) -> None:
        """A reply from ``member`` computed by ``version``: learn what it tells, and raise StaleVersion unless
        it is the version wanted now."""
        if version is not None and version != member.version:
            self.learn(member, await member.conn.model_info())
        if not self.is_wanted(version):
            raise StaleVersion(
                f"{member.url} answered from target version {version}, not {self.wanted_version()}"
            )

    async def _version_poll(self) -> None:
        """Every ``version_poll_interval``, each healthy member is asked its /model_info: members at other
        versions get no requests, and one refreshed without a request since would be found out late."""
        while True:
            await asyncio.sleep(self.options.version_poll_interval)
            for member in self.healthy():
                with contextlib.suppress(Exception):  # a member that fails is upkeep's business
                    self.learn(member, await member.conn.model_info())
