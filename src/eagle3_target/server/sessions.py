"""Client sessions of a long-lived target server.

A session is named by the X-Eagle3-Session header, or by the peer address for
a stock NeMo client that sends none. It holds that client's vocab mapping and
ends on /disconnect or after ``ttl`` seconds without a request or heartbeat.
Whoever keeps per-session state (the p2p groups) subscribes to endings. The table keeps
its own gauge of live sessions.

A NeMo client never heartbeats and cannot re-send its mapping, so an idle
pause longer than the ttl (a long evaluation, say) must not cost it the
mapping: when a peer-named session ends, by expiry or /disconnect, its mapping
is kept for that peer's next request. Several NeMo trainers on one node share
one peer address, so one's /disconnect must not strand the others. Its point-to-point
group is released as usual. Kept mappings are bounded (oldest dropped),
and so is the number of live sessions.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Gauge

from eagle3_target.protocol.supervision import VocabMapping

from .errors import NoVocabMapping, TooManySessions
from .options import DEFAULT_MAX_SESSIONS

PEER_PREFIX = "peer:"
MAX_KEPT_MAPPINGS = 256


def session_id(header: str | None, peer: str | None) -> str:
    return header or f"{PEER_PREFIX}{peer}"


@dataclass
class Session:
    id: str
    last_seen: float
    vocab: VocabMapping | None = None

    def mapping(self) -> VocabMapping:
        """The session's vocab mapping; NoVocabMapping if it has sent none."""
        if self.vocab is None:
            raise NoVocabMapping()
        return self.vocab


class SessionTable:
    def __init__(
        self,
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        gauge: Gauge | None = None,
    ):
        self.ttl = ttl
        self.max_sessions = max_sessions
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._kept_vocab: OrderedDict[str, VocabMapping] = OrderedDict()  # ended peer-named sessions
        self._on_end: list[Callable[[Session], None]] = []
        self._gauge = gauge

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def __len__(self) -> int:
        return len(self._sessions)

    def on_end(self, callback: Callable[[Session], None]) -> None:
        self._on_end.append(callback)

    def touch(self, session_id: str) -> Session:
        now = self._clock()
        session = self._sessions.get(session_id)
        if session is None:
            if len(self._sessions) >= self.max_sessions:
                raise TooManySessions(
                    "too_many_requests", f"this server already holds {self.max_sessions} sessions"
                )
            vocab = self._kept_vocab.pop(session_id, None)
            session = self._sessions[session_id] = Session(session_id, now, vocab)
            self._count()
        session.last_seen = now
        return session

    def end(self, session_id: str) -> bool:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        if session_id.startswith(PEER_PREFIX) and session.vocab is not None:
            self._kept_vocab[session_id] = session.vocab
            while len(self._kept_vocab) > MAX_KEPT_MAPPINGS:
                self._kept_vocab.popitem(last=False)
        self._count()
        for callback in self._on_end:
            callback(session)
        return True

    def expire(self) -> list[str]:
        """End every session idle for longer than ttl (ttl <= 0 keeps them forever)."""
        if self.ttl <= 0:
            return []
        deadline = self._clock() - self.ttl
        stale = [sid for sid, s in self._sessions.items() if s.last_seen < deadline]
        for sid in stale:
            self.end(sid)
        return stale

    def end_all(self) -> None:
        for sid in list(self._sessions):
            self.end(sid)

    def _count(self) -> None:
        if self._gauge is not None:
            self._gauge.set(len(self._sessions))
