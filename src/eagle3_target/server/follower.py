"""A node-rank > 0 `serve`: no model endpoints, only /livez, while this node's ranks follow rank 0."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
from typing import NoReturn

from aiohttp import web

from eagle3_target.protocol import contract

from .runners import follow_runner

log = logging.getLogger(__name__)


async def serve_follower(engine: str, options: dict, *socks: socket.socket) -> int:
    """Serve /livez on ``socks`` until the replica ends (0) or following fails (1); SIGTERM ends it (0)."""
    app = web.Application()
    app.router.add_get("/" + contract.LIVEZ, _livez)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    for sock in socks:
        site = web.SockSite(runner, sock)
        await site.start()
        log.info("listening on %s (/livez only)", site.name)
    signalled, ended = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, signalled.set)
    failure: list[BaseException] = []

    def follow() -> None:
        try:
            follow_runner(engine, **options)
        except BaseException as exc:  # noqa: BLE001 - reported below, as the process's exit code
            failure.append(exc)
        loop.call_soon_threadsafe(ended.set)

    # A daemon thread, not asyncio.to_thread: asyncio.run would wait for the executor's threads at exit,
    # and a rank still waiting for its head would keep a SIGTERM'd follower alive for minutes.
    threading.Thread(target=follow, daemon=True, name="eagle3-follow").start()
    waits = [asyncio.ensure_future(event.wait()) for event in (signalled, ended)]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()
    await runner.cleanup()
    if signalled.is_set():
        return 0  # this node's ranks and workers follow it out (lifeline.py)
    if failure:
        log.error("following node-rank 0 failed: %s", failure[0])
        return 1
    log.info("the replica ended")
    return 0


async def _livez(_request: web.Request) -> web.Response:
    return web.json_response({"status": "alive", "role": "follower"})


def run_follower(engine: str, options: dict, *socks: socket.socket) -> NoReturn:
    """serve_follower, then exit without waiting for the rank threads (as process.run_server)."""
    code = asyncio.run(serve_follower(engine, options, *socks))
    logging.shutdown()
    os._exit(code)
