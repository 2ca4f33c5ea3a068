"""The process around a TargetServer: listening sockets, the open-file limit, signals, drain, exit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
import socket
from typing import NoReturn

from aiohttp import web

from .app import TargetServer
from .rank_health import until_unhealthy

log = logging.getLogger(__name__)
LOST_RANK_CLEANUP = 5.0  # seconds to close the listeners and the model once a rank is gone


def listen(host: str, port: int) -> socket.socket:
    """The bound listening socket (IPv6 when the host is an IPv6 literal); raises OSError if taken. "::" binds
    every address of both families where the kernel allows dual-stack sockets (IPv4 arrives v4-mapped)."""
    if ":" not in host:
        return socket.create_server((host, port), family=socket.AF_INET, backlog=1024)
    dual = host == "::" and socket.has_dualstack_ipv6()
    return socket.create_server((host, port), family=socket.AF_INET6, dualstack_ipv6=dual, backlog=1024)


def raise_fd_limit() -> None:
    """Every connection is a file descriptor: take the hard limit, not the soft 1024 most images start with."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
        return
    log.info("open-file limit raised from %d to %d", soft, target)


async def serve(server: TargetServer, *socks: socket.socket) -> int:
    """Serve on ``socks`` until SIGINT/SIGTERM (which drain first), --exit-on-disconnect, a failed load
    or a lost rank of a split replica.

    Returns the exit code: 1 if the model failed to load or a rank was lost, else 0.
    """
    signalled = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, signalled.set)
    raise_fd_limit()
    runner = server.app_runner(shutdown_timeout=1.0)
    await runner.setup()
    for sock in socks:
        site = web.SockSite(runner, sock)
        await site.start()
        log.info("listening on %s (model loading in the background)", site.name)
    stopped = asyncio.create_task(server.service.stopped.wait())
    lost = asyncio.create_task(until_unhealthy(server))
    await asyncio.wait(
        [stopped, lost, asyncio.create_task(signalled.wait())], return_when=asyncio.FIRST_COMPLETED
    )
    if lost.done():
        # Bounded: the model thread may be stuck in a collective with the dead rank.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(runner.cleanup(), LOST_RANK_CLEANUP)
        return 1
    lost.cancel()
    try:
        if signalled.is_set():
            await server.drain()
    finally:
        with contextlib.suppress(Exception):
            await runner.cleanup()
    return 1 if server.service.model.load_error else 0


def run_server(server: TargetServer, *socks: socket.socket) -> NoReturn:
    """Serve (see serve), then exit the process without waiting for its threads.

    SIGTERM drains: readiness and new model requests answer 503 at once, requests in flight are
    finished and delivered for up to --drain-timeout. Interpreter shutdown would then join the
    worker threads, and a model load or a rendezvous can take minutes, past Kubernetes' grace
    period; nothing they hold needs saving, so the process leaves with os._exit.
    """
    code = asyncio.run(serve(server, *socks))
    logging.shutdown()
    os._exit(code)
