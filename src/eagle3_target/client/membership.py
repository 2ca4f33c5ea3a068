"""Who is in the pool: join, heartbeats, DNS refresh, quarantine and retirement of target servers.

A member's life: JOINING (waits for /health, checks its model against the
fleet's, receives the vocab mapping, makes its agreement) -> HEALTHY (takes
requests, sends heartbeats) -> QUARANTINED after a failure (re-probed through
/health, then joins again) -> DRAINING once DNS no longer lists it (finishes
what it holds, then our session there is ended). REFUSED members serve another
model, or refused us for good (a 4xx such as a wrong token).

The parts call one another in a cycle (admission starts heartbeats, a failed heartbeat quarantines, a
quarantine rejoins, DNS adds members to join and retires others), so they are one object over one shared
state (members.py's Roster), each part in its own module: joining.py, upkeep.py (heartbeats and DNS
refresh), quarantine.py and versions.py (which target version each member serves, and which one dispatch
wants).
"""

from __future__ import annotations

from .joining import Joining
from .quarantine import Quarantine
from .upkeep import Upkeep
from .versions import Versions


class Membership(Joining, Upkeep, Quarantine, Versions):
    """The pool's membership: what dispatch asks (who is healthy) and tells (a failure, a 429, a release)."""
