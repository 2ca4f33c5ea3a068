"""Endpoint specs and their resolution against a real DNS server on loopback."""

from __future__ import annotations

import asyncio
import threading

import dns.resolver
import pytest

from eagle3_target.client import PoolOptions, RemoteTargetBackend
from eagle3_target.client.endpoints import (
    EndpointError,
    EndpointResolver,
    EndpointSpec,
    base_url,
    default_spec,
    make_resolver,
    parse_specs,
)

pytestmark = pytest.mark.timeout(30)

SERVICE = "targets.team.svc.cluster.local"


def test_parse_specs():
    assert parse_specs("http://10.0.0.1:8001/, dns://svc.ns:9000,srv://_http._tcp.svc.ns") == [
        EndpointSpec("http", "http://10.0.0.1:8001"),
        EndpointSpec("dns", "svc.ns", 9000),
        EndpointSpec("srv", "_http._tcp.svc.ns"),
    ]
    assert parse_specs("dns://svc.ns") == [EndpointSpec("dns", "svc.ns", 8001)]


def test_a_bare_host_and_port_is_taken_as_http():
    assert parse_specs("10.0.0.1:8001, svc.ns:9000,[fd00::5]:8001") == [
        EndpointSpec("http", "http://10.0.0.1:8001"),
        EndpointSpec("http", "http://svc.ns:9000"),
        EndpointSpec("http", "http://[fd00::5]:8001"),
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("svc.ns", "no scheme"),
        ("svc.ns:http", "no scheme"),
        ("ftp://svc", "unknown scheme"),
        ("dns://svc:http", "bad port"),
        ("srv://_http._tcp.svc:8001", "SRV records carry the ports"),
        (" , ", "no endpoints"),
    ],
)
def test_bad_specs_are_named(text, message):
    with pytest.raises(EndpointError, match=message):
        parse_specs(text)


def test_default_spec_comes_from_the_environment(monkeypatch):
    with pytest.raises(EndpointError, match="EAGLE3_TARGET_SERVICE"):
        default_spec()
    monkeypatch.setenv("EAGLE3_TARGET_SERVICE", f"dns://{SERVICE}:8001")
    assert default_spec() == f"dns://{SERVICE}:8001"


async def test_a_and_srv_records(dns_server):
    dns_server.set_a(SERVICE, ["127.0.0.3", "127.0.0.2"])
    dns_server.set_a(f"pod-0.{SERVICE}", ["127.0.0.4"])
    dns_server.set_a(f"pod-1.{SERVICE}", ["127.0.0.5"])
    dns_server.set_srv(f"_http._tcp.{SERVICE}", [(f"pod-0.{SERVICE}", 9001), (f"pod-1.{SERVICE}", 9002)])
    resolver = make_resolver(dns_server.address)
    urls = await EndpointResolver(
        parse_specs(f"dns://{SERVICE}:8005, http://127.0.0.9:1"), resolver
    ).resolve()
    assert urls == ["http://127.0.0.2:8005", "http://127.0.0.3:8005", "http://127.0.0.9:1"]
    urls = await EndpointResolver(parse_specs(f"srv://_http._tcp.{SERVICE}"), resolver).resolve()
    assert urls == ["http://127.0.0.4:9001", "http://127.0.0.5:9002"]


async def test_a_name_that_appears_late_is_waited_for(dns_server):
    threading.Timer(0.6, dns_server.set_a, (SERVICE, ["127.0.0.2"])).start()
    resolver = EndpointResolver(parse_specs(f"dns://{SERVICE}"), make_resolver(dns_server.address))
    loop = asyncio.get_running_loop()
    assert await resolver.resolve_until(loop.time() + 10, first_delay=0.05) == ["http://127.0.0.2:8001"]
    assert dns_server.queries >= 2


async def test_a_name_that_never_resolves_fails_naming_it(dns_server):
    resolver = EndpointResolver(parse_specs(f"dns://{SERVICE}"), make_resolver(dns_server.address))
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(EndpointError, match=f"dns://{SERVICE}:8001 did not resolve"):
        await resolver.resolve_until(start + 0.8, first_delay=0.05, max_delay=0.2)
    assert loop.time() - start < 3
    assert dns_server.queries >= 3  # retried with backoff, not given up at once


async def test_aaaa_records_join_a_records_and_ipv6_is_bracketed(dns_server):
    """Dual-stack pods answer A and AAAA; IPv6-only pods AAAA alone. Every address is a server, in URL form."""
    dns_server.set_a(SERVICE, ["127.0.0.2"])
    dns_server.set_aaaa(SERVICE, ["fd00::2", "::1"])
    dns_server.set_aaaa(f"pod-0.{SERVICE}", ["fd00::10"])
    dns_server.set_srv(f"_http._tcp.{SERVICE}", [(f"pod-0.{SERVICE}", 9001)])
    resolver = make_resolver(dns_server.address)
    urls = await EndpointResolver(parse_specs(f"dns://{SERVICE}:8005"), resolver).resolve()
    assert urls == ["http://127.0.0.2:8005", "http://[::1]:8005", "http://[fd00::2]:8005"]
    urls = await EndpointResolver(parse_specs(f"srv://_http._tcp.{SERVICE}"), resolver).resolve()
    assert urls == ["http://[fd00::10]:9001"]


async def test_a_name_without_addresses_is_not_resolved(dns_server):
    dns_server.set_srv(f"_http._tcp.{SERVICE}", [(SERVICE, 9001)])  # SERVICE exists as a name, no A or AAAA
    dns_server.set_a(f"other.{SERVICE}", [])
    resolver = EndpointResolver(parse_specs(f"dns://other.{SERVICE}"), make_resolver(dns_server.address))
    loop = asyncio.get_running_loop()
    with pytest.raises(EndpointError, match="did not resolve in time; last error: NoAnswer"):
        await resolver.resolve_until(loop.time() + 0.5, first_delay=0.05, max_delay=0.1)


def test_a_machine_without_nameservers_is_named_and_http_endpoints_still_work(tmp_path, monkeypatch):
    """An /etc/resolv.conf that names no server (a minimal container): dnspython's own error was a traceback."""
    empty = tmp_path / "resolv.conf"
    empty.write_text("search cluster.local\n")
    read = dns.resolver.BaseResolver.read_resolv_conf
    monkeypatch.setattr(dns.resolver.BaseResolver, "read_resolv_conf", lambda self, _: read(self, str(empty)))
    with pytest.raises(
        EndpointError, match=r"no DNS server to resolve srv://_http._tcp.x.ns: .*--nameserver"
    ):
        EndpointResolver(parse_specs("http://10.0.0.1:8001,srv://_http._tcp.x.ns"))
    resolver = EndpointResolver(parse_specs("http://10.0.0.1:8001"))
    assert asyncio.run(resolver.resolve()) == ["http://10.0.0.1:8001"]


def test_base_urls_bracket_ipv6():
    assert base_url("10.0.0.5", 8001) == "http://10.0.0.5:8001"
    assert base_url("fd00::5", 8001) == "http://[fd00::5]:8001"
    assert parse_specs("http://[fd00::5]:8001/") == [EndpointSpec("http", "http://[fd00::5]:8001")]


@pytest.mark.parametrize("content", ["", " \n"])
def test_an_empty_token_file_is_refused_not_taken_for_no_token(tmp_path, monkeypatch, content):
    """The server's rule (contract.read_token_file): sending no token would only fail later, as a 401."""
    token = tmp_path / "token"
    token.write_text(content)
    monkeypatch.setenv("EAGLE3_TARGET_AUTH_TOKEN_FILE", str(token))
    with pytest.raises(EndpointError, match=f"EAGLE3_TARGET_AUTH_TOKEN_FILE={token} is empty"):
        RemoteTargetBackend("http://127.0.0.1:9", options=PoolOptions(start_timeout=1))
