"""A vLLM replica's ranks and nodes: whether they all live, and a node that follows the head.

vLLM watches none of this itself across nodes: a headless node outlives its head, and a head goes on
without a node that died. So every node beats a counter in the replica's own rendezvous store (the
TCPStore on ``master_addr:master_port``, served by global rank 0 on the head node) and watches the
others': a counter standing still, or the store gone, means that node is gone.
"""

from __future__ import annotations

import logging
import multiprocessing.connection
import os
import threading
import time
from datetime import timedelta

from ..parallel import ParallelLayout

log = logging.getLogger(__name__)

BEAT_S = 2.0  # how often each node beats
STALE_S = 10.0  # a counter still this long: its node is gone (rank 0 then answers 503 and exits within 30 s)
START_S = 180.0  # the head beats only once its engine is up; until a node's first beat, this long
BEAT_KEY = "eagle3_target/vllm_beat/{}"


class Heartbeat:
    """This node's beat in the replica's store, and the beats of ``watched`` nodes."""

    def __init__(self, parallel: ParallelLayout, watched: list[int]):
        from torch.distributed import TCPStore

        self.node = parallel.node_rank
        self.store = TCPStore(
            parallel.master_addr,
            parallel.master_port,
            is_master=False,
            timeout=timedelta(seconds=STALE_S / 2),
            wait_for_workers=False,
        )
        now = time.monotonic()
        self.seen = {node: (-1, now) for node in watched}  # count, when it last moved
        self.gone: str | None = None
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="eagle3-vllm-heartbeat")
        self.thread.start()

    def _run(self) -> None:
        # The first beat at once: a head ready and a node killed moments later must find it counted.
        while self.gone is None:
            try:
                self.store.add(BEAT_KEY.format(self.node), 1)
                counts = {node: self.store.add(BEAT_KEY.format(node), 0) for node in self.seen}
            except Exception as exc:  # the store's server, on the head node, is gone
                self.gone = f"the replica's rendezvous store is gone ({exc})"
                break
            self._check(counts, time.monotonic())
            if self.stopped.wait(BEAT_S):
                break

    def _check(self, counts: dict[int, int], now: float) -> None:
        for node, count in counts.items():
            last, since = self.seen[node]
            if count != last:
                self.seen[node] = (count, now)
            # A count above 0 is a node that has beaten, seen moving or not: a node killed before this
            # watch saw its count move twice is still gone after STALE_S, not START_S.
            elif now - since > (STALE_S if count > 0 else START_S):
                self.gone = f"node {node} stopped beating {now - since:.0f} s ago"

    def alive(self) -> bool:
        return self.gone is None

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=BEAT_S * 3)


def executor_alive(executor) -> bool:
    """Whether every local worker process of a vLLM executor lives (an in-process executor: always)."""
    workers = getattr(executor, "workers", None)
    if workers is None:
        return True
    return not getattr(executor, "is_failed", False) and all(w.proc.is_alive() for w in workers)


def follow(args: dict, parallel: ParallelLayout) -> None:
    """Run this node's ranks of the replica headed by node-rank 0, until the head is gone (return) or one
    of this node's workers dies (RuntimeError); either way this node's workers are ended first."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    config = EngineArgs(**args).create_engine_config(headless=True)
    log.info(
        "vLLM node %d of %d: starting its ranks, head at %s:%d",
        parallel.node_rank,
        parallel.nnodes,
        parallel.master_addr,
        parallel.master_port,
    )
    executor = MultiprocExecutor(config, monitor_workers=False)
    beat = None
    try:
        beat = Heartbeat(parallel, watched=[0])
        sentinels = [w.proc.sentinel for w in executor.workers]
        while beat.alive():
            if multiprocessing.connection.wait(sentinels, timeout=BEAT_S):
                raise RuntimeError(f"a vLLM worker of node {parallel.node_rank} died")
        log.warning(
            "vLLM node %d: the head is gone (%s); ending this node's ranks", parallel.node_rank, beat.gone
        )
    finally:
        if beat is not None:
            beat.stop()
        # Nothing of the replica is left to finish: vLLM's own shutdown would wait on workers stuck in a
        # collective with ranks that are gone (a 5 s grace, then SIGTERM, then SIGKILL).
        for worker in executor.workers:
            worker.proc.kill()
        executor.shutdown()
        log.info("vLLM node %d: ranks ended (pid %d)", parallel.node_rank, os.getpid())
