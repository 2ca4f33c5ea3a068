"""The rank processes of one split replica: start them, join their group, and watch that they all live.

Every node's `serve` process is one rank and starts the node's other ranks itself (``python -m
eagle3_target.server.rank_process``), so no launcher is asked of the user. Rank 0 hosts the rendezvous
store; every other rank adds to a heartbeat counter in it each second. Death is seen three ways:
rank 0 polls its own children and the counters (a counter that stops for ``STALE_AFTER`` seconds is
a dead rank); every other rank exits at once when the store stops answering (rank 0 is gone), when
its parent dies (a rank started by a node's `serve`, from its first moment: lifeline.py) or when one of
its own children dies.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from .parallel import ParallelLayout

log = logging.getLogger(__name__)

BEAT_EVERY = 1.0  # seconds between a rank's heartbeats
STALE_AFTER = 10.0  # rank 0 calls a rank dead when its heartbeat has not moved for this long
JOIN_TIMEOUT = datetime.timedelta(seconds=600)  # other nodes may start minutes apart
# Ranks wait for rank 0's next command for as long as the replica lives: death is the watchdogs' to see.
IDLE_TIMEOUT = datetime.timedelta(days=365)
RANK_PROCESS = "eagle3_target.server.rank_process"  # what a started rank runs (python -m)


@dataclass(frozen=True)
class RankSpec:
    """What a rank process needs to join: its global rank, the group and the model to load."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    options: dict  # the runner's load options, JSON-safe (no layout)


class RankGroup:
    """This process's place in a replica's group: the store, its children, and the watchdog."""

    def __init__(self, spec: RankSpec, children: list[subprocess.Popen], store: dist.TCPStore):
        self.spec, self.children, self.store = spec, children, store
        self.dead: str | None = None  # why the replica is broken, as rank 0 saw it
        self._beats: dict[int, tuple[int, float]] = {}

    @property
    def rank(self) -> int:
        return self.spec.rank

    def watch(self) -> None:
        threading.Thread(target=self._watch, name=f"rank-{self.rank}-watchdog", daemon=True).start()

    def _watch(self) -> None:
        beat = None if self.rank == 0 else _client(self.spec, datetime.timedelta(seconds=5))
        while self.dead is None:
            dead_child = next((c for c in self.children if c.poll() is not None), None)
            if dead_child is not None:
                self._lost(f"rank process {dead_child.pid} exited with {dead_child.returncode}")
            elif self.rank == 0:
                self._check_beats()
            else:
                try:
                    beat.add(f"beat/{self.rank}", 1)
                except Exception as exc:  # noqa: BLE001 - any failure means rank 0's store is gone
                    self._lost(f"rank 0 is gone ({type(exc).__name__})")
            time.sleep(BEAT_EVERY)

    def _check_beats(self) -> None:
        now = time.monotonic()
        for rank in range(1, self.spec.world_size):
            count = self.store.add(f"beat/{rank}", 0)
            last, since = self._beats.get(rank, (-1, now))
            if count != last:
                self._beats[rank] = (count, now)
            elif now - since > STALE_AFTER:
                self._lost(f"rank {rank} stopped beating {now - since:.0f}s ago")

    def _lost(self, why: str) -> None:
        self.dead = why
        if self.rank == 0:
            log.error("the replica lost a rank: %s", why)
            return
        log.error("rank %d exits: %s", self.rank, why)
        self.stop_children()
        logging.shutdown()
        os._exit(1)

    def stop_children(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()
        for child in self.children:
            child.wait()


def _client(spec: RankSpec, timeout: datetime.timedelta) -> dist.TCPStore:
    return dist.TCPStore(spec.master_addr, spec.master_port, is_master=False, timeout=timeout)


def join(layout: ParallelLayout, options: dict, device: str) -> RankGroup:
    """Start this node's other ranks, then join the replica's group as this node's first rank."""
    per_node = layout.world_size // layout.nnodes
    first = layout.node_rank * per_node
    store = None
    port = layout.master_port
    if first == 0:
        # One node: a free loopback port, so two replicas on one machine never meet.
        host, port = (layout.master_addr, port) if layout.nnodes > 1 else ("127.0.0.1", 0)
        store = dist.TCPStore(host, port, layout.world_size, is_master=True, wait_for_workers=False)
        port = store.port
    addr = layout.master_addr if layout.nnodes > 1 else "127.0.0.1"
    specs = [RankSpec(first + i, layout.world_size, i, addr, port, options) for i in range(per_node)]
    children = [_start(spec) for spec in specs[1:]]
    return join_rank(specs[0], children, store, device)


def _start(spec: RankSpec) -> subprocess.Popen:
    # this process's pid too: the child sees it gone even if it goes while the child imports torch
    command = [sys.executable, "-m", RANK_PROCESS, json.dumps(asdict(spec)), str(os.getpid())]
    return subprocess.Popen(command)


def join_rank(spec: RankSpec, children, store, device: str) -> RankGroup:
    """Join the group as ``spec``'s rank (``store``: rank 0's own; None: a client of it), its ``children``
    watched."""
    os.environ["LOCAL_RANK"] = str(spec.local_rank)  # transformers binds a rank's GPU by it
    store = store or _client(spec, JOIN_TIMEOUT)
    store.add("joined", 1)
    wait_for_ranks(store, spec.world_size, JOIN_TIMEOUT.total_seconds())
    group = RankGroup(spec, children, store)
    if spec.rank:
        group.watch()  # beats from the start: rank 0 counts them once the group is whole
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.set_device(spec.local_rank)
    elif "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // (len(children) + 1)))
    dist.init_process_group(
        "nccl" if kind == "cuda" else "gloo",
        store=dist.PrefixStore("group", store),
        rank=spec.rank,
        world_size=spec.world_size,
        timeout=IDLE_TIMEOUT,
    )
    if spec.rank == 0:
        group.watch()
    log.info("rank %d of %d joined", spec.rank, spec.world_size)
    return group


def wait_for_ranks(store: dist.TCPStore, world_size: int, timeout: float, say_every: float = 30.0) -> None:
    """Until every rank has joined, saying who is missing; a replica whose other nodes never start fails
    after ``timeout`` seconds with the reason instead of waiting as long as the group's collectives may."""
    start = said = time.monotonic()
    while (joined := store.add("joined", 0)) < world_size:
        waited = time.monotonic() - start
        if waited > timeout:
            raise RuntimeError(
                f"only {joined} of the replica's {world_size} ranks joined in {timeout:.0f}s: start every "
                "node's `serve` with the same --nnodes, --master-addr and --master-port"
            )
        if time.monotonic() - said > say_every:
            log.info("%d of %d ranks joined; waiting for the others (%.0fs)", joined, world_size, waited)
            said = time.monotonic()
        time.sleep(0.2)


def rank_device(device: str, local_rank: int) -> str:
    """A rank's own device: cuda:<local rank> on GPUs, cpu on CPUs."""
    return f"cuda:{local_rank}" if torch.device(device).type == "cuda" else device
