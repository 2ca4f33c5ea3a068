"""While the client waits for servers it says, every few seconds, which it cannot reach and why."""

import asyncio
import contextlib
import logging
import threading
import time

import pytest
from aiohttp import web

from eagle3_target.client import BatchFailedError, EndpointError, PoolOptions, RemoteTargetBackend

from ..target_support import free_port


@contextlib.contextmanager
def loading_server(host: str = "127.0.0.2"):
    """A server that is up but never ready: /health answers 503, as ours does while the model loads."""

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "loading"}, status=503)

    app = web.Application()
    app.router.add_get("/health", health)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner = web.AppRunner(app, access_log=None)

    async def up() -> int:
        await runner.setup()
        await web.TCPSite(runner, host, 0).start()  # the kernel's pick, bound at once: no port to race for
        return runner.addresses[0][1]

    port = asyncio.run_coroutine_threadsafe(up(), loop).result(10)
    try:
        yield f"http://{host}:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def warnings_naming(caplog, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


def test_a_wrong_url_is_named_with_its_reason_within_seconds(caplog):
    """A closed port: the default wait_log_interval (5 s) names it long before start_timeout."""
    caplog.set_level(logging.WARNING, logger="eagle3_target.client")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.time()
    with pytest.raises(BatchFailedError, match="no target server became ready within 12s"):
        RemoteTargetBackend(url, options=PoolOptions(start_timeout=12))
    warnings = warnings_naming(caplog, url)
    assert len(warnings) >= 2, [r.getMessage() for r in caplog.records]  # at ~5 s and ~10 s
    assert warnings[0].created - started < 7
    assert "Connection refused" in warnings[0].getMessage()
    assert warnings[1].created - warnings[0].created >= 4.5  # every few seconds, not in a busy loop


def test_a_name_that_does_not_resolve_is_named_with_the_dns_answer(caplog, dns_server):
    caplog.set_level(logging.WARNING, logger="eagle3_target.client")
    spec = "dns://missing.team.svc.cluster.local:8001"
    with pytest.raises(EndpointError, match="did not resolve in time"):
        RemoteTargetBackend(
            spec, nameserver=dns_server.address, options=PoolOptions(start_timeout=4, wait_log_interval=1)
        )
    warnings = warnings_naming(caplog, spec)
    assert warnings and "NXDOMAIN" in warnings[0].getMessage(), [r.getMessage() for r in caplog.records]


def test_a_server_that_is_still_loading_is_named_as_not_ready(caplog):
    caplog.set_level(logging.WARNING, logger="eagle3_target.client")
    with loading_server() as url:
        options = PoolOptions(start_timeout=3, wait_log_interval=1)
        with pytest.raises(BatchFailedError, match=f"{url} joining .*HTTP 503 loading"):
            RemoteTargetBackend(url, options=options)
    warnings = warnings_naming(caplog, url)
    assert warnings and "HTTP 503 loading" in warnings[0].getMessage(), [
        r.getMessage() for r in caplog.records
    ]
