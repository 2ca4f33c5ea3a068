"""While the client waits for servers it says which it cannot reach and why: after 5 s, then backing off
(10, 20, 40, 60 s, then every 60 s)."""

import asyncio
import contextlib
import logging
import re
import threading
import time
from types import SimpleNamespace

import dns.resolver
import pytest
from aiohttp import web

from eagle3_target.client import BatchFailedError, EndpointError, PoolOptions, RemoteTargetBackend
from eagle3_target.client.endpoints import EndpointResolver, parse_specs
from eagle3_target.client.members import Member
from eagle3_target.client.membership import Membership

from ..target_support import free_port
from .client_support import wait_until


@contextlib.contextmanager
def loading_server(host: str = "127.0.0.2", routes: dict | None = None):
    """A server that is up but never ready: /health answers 503, as ours does while the model loads
    (or one answering with ``routes``, path -> handler)."""

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "loading"}, status=503)

    app = web.Application()
    for path, handler in (routes or {"/health": health}).items():
        app.router.add_route("*", path, handler)
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
    """A closed port: named after 5 s (the default wait_log_interval), then not again for 10 s."""
    caplog.set_level(logging.WARNING, logger="eagle3_target.client")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.time()
    with pytest.raises(BatchFailedError, match="no target server became ready within 12s"):
        RemoteTargetBackend(url, options=PoolOptions(start_timeout=12))
    warnings = warnings_naming(caplog, url)
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]  # at ~5 s; the next is due at ~15 s
    assert warnings[0].created - started < 7
    assert "Connection refused" in warnings[0].getMessage()


# Over NeMo's 300 s start timeout: after 5 s, then 10, 20, 40, 60 s apart, then every 60 s.
BACKING_OFF = [5, 15, 35, 75, 135, 195, 255]


@pytest.fixture
async def fake_clock(monkeypatch):
    """The running loop's clock, moved only by the test: a 300 s wait takes no time."""
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(asyncio.get_running_loop(), "time", lambda: clock.now)
    return clock


def warned_at(caplog, text: str) -> list[int]:
    return [int(re.search(r"after (\d+)s", r.getMessage())[1]) for r in warnings_naming(caplog, text)]


async def test_waiting_for_a_dead_server_warns_backing_off(caplog, fake_clock, monkeypatch):
    async def wait_changed(self, timeout):  # nothing changes: the wait runs out
        fake_clock.now += timeout
        return False

    monkeypatch.setattr(Membership, "wait_changed", wait_changed)
    caplog.set_level(logging.WARNING, logger="eagle3_target.client")
    membership = Membership(resolver=None, connect=None, options=PoolOptions())
    url = "http://127.0.0.1:9"
    why = "cannot connect to 127.0.0.1:9: Connection refused"
    membership.members[url] = Member(conn=SimpleNamespace(url=url), last_error=why)
    with pytest.raises(BatchFailedError, match="within 300s"):
        await membership._first_healthy(deadline=300.0)
    assert warned_at(caplog, f"{url} joining ({why})") == BACKING_OFF


async def test_waiting_for_a_name_to_resolve_warns_backing_off(caplog, fake_clock, monkeypatch):
    async def sleep(seconds):
        fake_clock.now += seconds

    async def nxdomain():
        raise dns.resolver.NXDOMAIN()

    monkeypatch.setattr(asyncio, "sleep", sleep)
    caplog.set_level(logging.WARNING, logger="eagle3_target.client")
    spec = "dns://missing.team.svc.cluster.local:8001"
    resolver = EndpointResolver(parse_specs(spec))
    resolver.resolve = nxdomain
    with pytest.raises(EndpointError, match="did not resolve in time"):
        await resolver.resolve_until(300.0)
    assert warned_at(caplog, spec) == BACKING_OFF
    assert all("NXDOMAIN" in r.getMessage() for r in warnings_naming(caplog, spec))


def test_the_schedule_is_the_options():
    options = PoolOptions(wait_log_interval=1, wait_log_max=4)
    warn, due = options.wait_warnings(0.0), []
    for now in range(20):
        if warn.due(now):
            due.append(now)
    assert due == [1, 3, 7, 11, 15, 19]
    warn = PoolOptions(wait_log_interval=90).wait_warnings(0.0)  # a first gap past the cap stays the gap
    assert [warn.due(t) for t in (90, 179, 180)] == [True, False, True]


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


def test_a_server_answering_garbage_while_joining_is_quarantined_and_named_once(farm, caplog):
    """Ready by /health, but its /model_info is no JSON: a fault of that server (not a refusal, not a
    wait); it stays out of dispatch, and its reason is warned about once however often it is retried."""
    asked = []

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def model_info(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.Response(body=b"{not json", content_type="application/json")

    caplog.set_level(logging.WARNING, logger="eagle3_target.client")
    good = farm.start("127.0.0.3")
    options = PoolOptions(start_timeout=20, backoff_base=0.01, backoff_max=0.05)
    with (
        loading_server(routes={"/health": health, "/model_info": model_info}) as bad,
        RemoteTargetBackend([good, bad], options=options) as backend,
    ):
        wait_until(lambda: len(asked) >= 4)  # joined and failed three times since the first probe
        assert backend.healthy_servers == 1
        assert (
            f"{bad} quarantined (ServerFault: {bad}/model_info is not JSON: "
            in backend.pool.describe_members()
        )
    reason = f"{bad} cannot join: ServerFault: {bad}/model_info is not JSON: "
    named = [r.getMessage() for r in warnings_naming(caplog, bad)]
    assert [m.startswith(reason) for m in named] == [True], named
