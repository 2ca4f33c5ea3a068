"""The client's settings: one PoolOptions for the whole pool."""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_target.protocol import encodings
from eagle3_target.protocol.choices import DATA_PATHS
from eagle3_target.protocol.features import Features

POLICIES = ("least-loaded", "round-robin")


@dataclass
class PoolOptions:
    request_timeout: float = 120.0  # one attempt on one server
    deadline: float = 600.0  # all attempts of one request, failover included
    start_timeout: float = 300.0  # resolving and the first healthy server
    wait_log_interval: float = (
        5.0  # while waiting for servers, a warning naming the unreachable ones this often
    )
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
    # A feature request (protocol/features.py) every server must be able to serve, checked at join;
    # RemoteTargetBackend.capture asks it. None: EAGLE-3's supervision only.
    features: Features | None = None
    # True: generate_batch may carry NeMo's packing metadata; a server that cannot honour it is refused at join
    packing: bool = False

    def __post_init__(self):
        if self.encoding not in encodings.CHOICES:
            raise ValueError(f"unknown encoding {self.encoding!r}; choose {', '.join(encodings.CHOICES)}")
        if self.data_path not in DATA_PATHS:
            raise ValueError(f"unknown data path {self.data_path!r}; choose {', '.join(DATA_PATHS)}")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown dispatch policy {self.policy!r}; choose {', '.join(POLICIES)}")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if self.wait_log_interval <= 0:
            raise ValueError("wait_log_interval must be positive")
