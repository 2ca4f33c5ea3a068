"""The client's settings: one PoolOptions for the whole pool."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from eagle3_target.protocol import contract, encodings
from eagle3_target.protocol.choices import DATA_PATHS
from eagle3_target.protocol.features import Features
from eagle3_target.protocol.model_info import NEWEST, ModelInfo, check_version_choice

POLICIES = ("least-loaded", "round-robin")


@dataclass
class PoolOptions:
    request_timeout: float = 120.0  # one attempt on one server
    deadline: float = 600.0  # all attempts of one request, failover included
    start_timeout: float = 300.0  # resolving and the first healthy server
    # While waiting for servers, a warning names the unreachable ones and why: first after wait_log_interval,
    # then after twice the last gap, at most wait_log_max (5, 10, 20, 40, 60, 60 ... s).
    wait_log_interval: float = 5.0
    wait_log_max: float = 60.0
    max_in_flight: int = 1  # per server, as NeMo
    policy: str = "least-loaded"
    resolve_interval: float = 30.0
    min_resolve_gap: float = 1.0  # after errors, re-resolve at most this often
    heartbeat_interval: float = 15.0
    backoff_base: float = 0.05
    backoff_max: float = 5.0
    # A server quarantined N times since its last good answer waits min(this, backoff_base x 4^N) before it
    # rejoins: one that stalls every time is not readmitted right after each hedge.
    readmit_backoff_max: float = 60.0
    max_endpoints: int = 256  # addresses taken from one DNS name (the rest are left out, with a warning)
    data_path: str = "auto"  # "auto": GPU-direct when both sides can; "wire"; "p2p" (gloo too; see p2p.py)
    # A /generate still unanswered after max(hedge_after, hedge_p99_factor x the observed p99) is re-sent
    # to another server: a stopped process or wedged GPU keeps its socket open, so only time tells.
    hedge_after: float = 10.0
    hedge_p99_factor: float = 5.0
    # "auto": per server, "logits" when offered, else "nemo" (both exact, so a mixed fleet agrees bit for bit)
    encoding: str = encodings.AUTO
    # A feature request (protocol/features.py) every server must be able to serve, checked at join, or the
    # request as a function of a server's /model_info (EAGLE-3 asks for the server's own aux layers, as NeMo's
    # remote target does); RemoteTargetBackend.capture asks it. None: EAGLE-3's supervision only.
    features: Features | Callable[[ModelInfo], Features] | None = None
    # True: generate_batch may carry NeMo's packing metadata; a server that cannot honour it is refused at join
    packing: bool = False
    # This job's X-Eagle3-Priority class (contract.PRIORITIES), its share of a server while others wait.
    # None sends no header: the server's default, "normal". A server that grants less refuses with 403.
    priority: str | None = None
    # The target version every batch comes from: "newest" (the latest refresh seen) or a label (versions.py);
    # every healthy member is asked its /model_info this often, so a refresh is seen without traffic too
    target_version: str = NEWEST
    version_poll_interval: float = 5.0

    def __post_init__(self):
        self.target_version = check_version_choice(self.target_version)
        if self.encoding not in encodings.CHOICES:
            raise ValueError(f"unknown encoding {self.encoding!r}; choose {', '.join(encodings.CHOICES)}")
        if self.data_path not in DATA_PATHS:
            raise ValueError(f"unknown data path {self.data_path!r}; choose {', '.join(DATA_PATHS)}")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown dispatch policy {self.policy!r}; choose {', '.join(POLICIES)}")
        if self.priority is not None and self.priority not in contract.PRIORITIES:
            raise ValueError(f"unknown priority {self.priority!r}; choose {', '.join(contract.PRIORITIES)}")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if self.wait_log_interval <= 0:
            raise ValueError("wait_log_interval must be positive")

    def wait_warnings(self, now: float) -> WaitWarnings:
        """The warning schedule of a wait that starts at ``now`` (loop time)."""
        return WaitWarnings(now, self.wait_log_interval, self.wait_log_max)


class WaitWarnings:
    """When a wait warns again: ``first`` seconds after it starts, then after twice the last gap, at most
    ``most`` (or ``first``, if longer), so a long wait keeps saying why without saying it every few seconds."""

    def __init__(self, now: float, first: float, most: float):
        self.gap, self.most, self.at = first, max(first, most), now + first

    def due(self, now: float) -> bool:
        """True once ``now`` reaches the next warning, which is then scheduled."""
        if now < self.at:
            return False
        self.gap = min(self.most, self.gap * 2)
        self.at = now + self.gap
        return True
