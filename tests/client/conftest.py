"""Fixtures: real target servers on loopback "pod" addresses and a real DNS server whose records change."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import urllib.request

import pytest
from aiohttp import web
from dnslib import AAAA, QTYPE, RR, SRV, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer, TCPServer, UDPServer
from target_support import TargetProcess

from eagle3_target.client.endpoints import base_url
from eagle3_target.server.app import TargetServer
from eagle3_target.server.options import ServerOptions
from eagle3_target.server.runners.synthetic import SyntheticRunner

# -- DNS -------------------------------------------------------------------------------------


class FakeDNS(BaseResolver):
    """Serves A, AAAA and SRV records from a table a test can change at any time (UDP and TCP, same port)."""

    def __init__(self):
        self.records: dict[tuple[str, str], list] = {}
        self.lock = threading.Lock()
        self.queries = 0

    def set_a(self, name: str, ips: list[str]) -> None:
        with self.lock:
            self.records[(name.rstrip(".") + ".", "A")] = [A(ip) for ip in ips]

    def set_aaaa(self, name: str, ips: list[str]) -> None:
        with self.lock:
            self.records[(name.rstrip(".") + ".", "AAAA")] = [AAAA(ip) for ip in ips]

    def set_srv(self, name: str, targets: list[tuple[str, int]]) -> None:
        with self.lock:
            self.records[(name.rstrip(".") + ".", "SRV")] = [SRV(0, 10, port, host) for host, port in targets]

    def remove(self, name: str) -> None:
        with self.lock:
            for key in [k for k in self.records if k[0] == name.rstrip(".") + "."]:
                del self.records[key]

    def resolve(self, request, handler):
        reply = request.reply()
        qname, qtype = str(request.q.qname), QTYPE[request.q.qtype]
        with self.lock:
            self.queries += 1
            rdatas = list(self.records.get((qname, qtype), []))
            known = any(k[0] == qname for k in self.records)
        for rdata in rdatas:
            reply.add_answer(RR(qname, getattr(QTYPE, qtype), rdata=rdata, ttl=1))
        if not known:
            reply.header.rcode = 3  # NXDOMAIN: the name does not exist (yet)
        return reply


class _UDPServer6(UDPServer):
    address_family = socket.AF_INET6


class _TCPServer6(TCPServer):
    address_family = socket.AF_INET6


@contextlib.contextmanager
def serve_dns(host: str):
    """A FakeDNS on host (IPv4 or IPv6 loopback), UDP and TCP on one port; .address is "host:port" for
    make_resolver, with an IPv6 host in brackets."""
    fake = FakeDNS()
    quiet = DNSLogger(log="-request,-reply,-truncated,-error,-recv,-send,-data")
    v6 = ":" in host
    for _ in range(20):  # the kernel picks a free UDP port; its TCP twin may be another process's
        udp = DNSServer(fake, address=host, port=0, logger=quiet, server=_UDPServer6 if v6 else None)
        port = udp.server.server_address[1]
        try:
            tcp = DNSServer(
                fake, address=host, port=port, tcp=True, logger=quiet, server=_TCPServer6 if v6 else None
            )
            break
        except OSError:
            udp.server.server_close()
    else:
        raise OSError(f"no port on {host} free for both UDP and TCP in 20 tries")
    udp.start_thread()
    tcp.start_thread()
    fake.address = f"[{host}]:{port}" if v6 else f"{host}:{port}"
    try:
        yield fake
    finally:
        udp.stop()
        tcp.stop()
        udp.server.server_close()
        tcp.server.server_close()


@pytest.fixture
def dns_server():
    with serve_dns("127.0.0.1") as fake:
        yield fake


@pytest.fixture
def dns_server_v6():
    """The same DNS server, reached over IPv6 (as in an IPv6-only cluster)."""
    with serve_dns("::1") as fake:
        yield fake


# -- in-process servers ----------------------------------------------------------------------


class ServerFarm:
    """Target servers on their own event-loop thread, as separate "pods" on 127.0.0.x."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servers: dict[str, tuple[TargetServer, web.AppRunner]] = {}

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def start(
        self,
        host: str,
        port: int = 0,
        *,
        options: ServerOptions | None = None,
        loader=None,
        server_type: type[TargetServer] = TargetServer,
        wait: bool = True,
        **runner_options,
    ) -> str:
        """Start a target server (default: synthetic) and return its URL once it answers /health with 200
        (at once with ``wait=False``: a server whose model is still loading)."""
        server = server_type(
            loader or (lambda: SyntheticRunner(**runner_options)), options or ServerOptions()
        )

        async def up():
            runner = web.AppRunner(server.app(), access_log=None, shutdown_timeout=1.0)
            await runner.setup()
            site = web.TCPSite(runner, host, port)
            await site.start()
            return runner, runner.addresses[0][1]

        runner, bound = self._run(up())
        url = base_url(host, bound)
        self.servers[url] = (server, runner)
        if wait:
            wait_healthy(url)
        return url

    def server(self, url: str) -> TargetServer:
        return self.servers[url][0]

    def stop(self, url: str) -> None:
        _, runner = self.servers.pop(url)
        self._run(runner.cleanup())

    def close(self) -> None:
        for url in list(self.servers):
            self.stop(url)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def wait_healthy(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while True:
        try:
            with opener.open(url + "/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not become healthy")
        time.sleep(0.05)


@pytest.fixture
def farm():
    farm = ServerFarm()
    yield farm
    farm.close()


# -- subprocess servers (for kill -9) --------------------------------------------------------


@pytest.fixture
def spawn_server():
    """`eagle3-target serve --engine synthetic` processes (for kill -9 and SIGSTOP), killed at the end."""
    started: list[TargetProcess] = []

    def spawn(host: str, forward_delay: float = 0.0) -> TargetProcess:
        started.append(TargetProcess(host, "--engine", "synthetic", "--forward-delay", str(forward_delay)))
        return started[-1]

    yield spawn
    for proc in started:
        proc.kill()


@pytest.fixture(autouse=True)
def _no_proxy_leak(monkeypatch):
    # The client must ignore proxies; make any leak fail loudly instead of reaching the network.
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("EAGLE3_TARGET_SERVICE", raising=False)
    monkeypatch.delenv("EAGLE3_TARGET_AUTH_TOKEN_FILE", raising=False)
    yield
