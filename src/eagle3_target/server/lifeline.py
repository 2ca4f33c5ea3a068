"""A child process that ends itself soon after the process that started it is gone.

A rank or vLLM worker may spend minutes starting (joining its group, loading weights) before any of its own
watches run; a parent killed then (SIGKILL, a node lost, a pod deleted) would leave it running for good. So
each such child calls ``exit_with_parent`` first thing.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time

log = logging.getLogger(__name__)

PERIOD_S = 1.0  # how often the parent is looked for: the child outlives it by about this long


def parent_pid() -> int:
    """The process that started this one: multiprocessing's record where there is one (a child whose parent
    died before this ran is then still seen as orphaned), else the current parent."""
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None and parent.pid else os.getppid()


def exit_with_parent(parent: int | None = None, period: float = PERIOD_S) -> None:
    """From now on, exit (code 1) within ``period`` seconds of the end of ``parent`` (default: the process
    that started this one), whatever else runs. A parent already gone ends this process at once."""
    parent = parent or parent_pid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(period)
        log.error("process %d: its parent %d is gone; exiting", os.getpid(), parent)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="eagle3-exit-with-parent").start()
