"""DNS answers are checked like any reply: addresses that cannot be target pods are dropped with one
warning each, one name yields at most max_endpoints, and a huge SRV set resolves in bounded time with
the healthy server among it admitted."""

from __future__ import annotations

import logging

import pytest

from eagle3_target.client import PoolOptions, RemoteTargetBackend
from eagle3_target.client.addresses import problem
from eagle3_target.client.endpoints import EndpointResolver, make_resolver, parse_specs

pytestmark = pytest.mark.timeout(120)

SERVICE = "targets.team.svc.cluster.local"


@pytest.mark.parametrize(
    "ip, port, why",
    [
        ("0.0.0.0", 8001, "unspecified"),
        ("::", 8001, "unspecified"),
        ("169.254.169.254", 80, "link-local"),
        ("::ffff:169.254.169.254", 80, "link-local"),
        ("fe80::1", 8001, "link-local"),
        ("224.0.0.1", 8001, "multicast"),
        ("ff02::1", 8001, "multicast"),
        ("255.255.255.255", 8001, "broadcast"),
        ("::ffff:0.0.0.0", 8001, "unspecified"),
        ("10.0.0.5", 0, "port 0"),
    ],
)
def test_addresses_that_cannot_be_target_pods(ip, port, why):
    assert why in problem(ip, port)


@pytest.mark.parametrize("ip", ["10.0.0.5", "127.0.0.1", "fd00::5", "::1", "192.168.1.255"])
def test_pod_addresses_pass(ip):
    assert problem(ip, 8001) is None


async def test_bad_answers_are_dropped_with_one_warning_each(dns_server, caplog):
    dns_server.set_a(SERVICE, ["0.0.0.0", "169.254.169.254", "224.0.0.1", "255.255.255.255", "127.0.0.5"])
    dns_server.set_aaaa(
        SERVICE, ["::", "fe80::1", "::ffff:a9fe:a9fe", "ff02::1", "::1"]
    )  # a9fe:a9fe: 169.254.169.254
    resolver = EndpointResolver(parse_specs(f"dns://{SERVICE}:8001"), make_resolver(dns_server.address))
    with caplog.at_level(logging.WARNING, "eagle3_target.client.addresses"):
        for _ in range(3):
            assert await resolver.resolve() == ["http://127.0.0.5:8001", "http://[::1]:8001"]
    assert len(caplog.records) == 8, [r.getMessage() for r in caplog.records]  # once each, not per refresh
    assert "169.254.169.254" in caplog.text and "link-local" in caplog.text


async def test_srv_port_zero_is_dropped(dns_server):
    dns_server.set_a(f"pod-0.{SERVICE}", ["127.0.0.4"])
    dns_server.set_a(f"pod-1.{SERVICE}", ["127.0.0.5"])
    dns_server.set_srv(f"_http._tcp.{SERVICE}", [(f"pod-0.{SERVICE}", 0), (f"pod-1.{SERVICE}", 9002)])
    resolver = EndpointResolver(parse_specs(f"srv://_http._tcp.{SERVICE}"), make_resolver(dns_server.address))
    assert await resolver.resolve() == ["http://127.0.0.5:9002"]


async def test_one_name_yields_at_most_max_endpoints(dns_server):
    dns_server.set_a(SERVICE, [f"127.0.{i // 200}.{i % 200 + 1}" for i in range(300)])
    spec = parse_specs(f"dns://{SERVICE}:8001")
    resolver = make_resolver(dns_server.address)
    assert len(await EndpointResolver(spec, resolver).resolve()) == 256  # the documented default
    assert len(await EndpointResolver(spec, resolver, max_endpoints=10).resolve()) == 10


def test_thousands_of_srv_records_resolve_in_bounded_time_and_the_healthy_server_joins(farm, dns_server):
    """1,000 SRV records x 5 addresses (5,000 URLs, all dead but one; 1,000 is what fits the test DNS
    server's UDP answers): before, 2,000 x 5 took 11.8 s to resolve and the healthy server was never
    admitted. Now at most 256 targets are resolved (32 at a time), 256 URLs taken, and the constructor
    returns with the healthy one."""
    url = farm.start("127.0.0.2")
    port = int(url.rsplit(":", 1)[1])
    records = []
    for i in range(1000):
        target = f"t{i:04d}.x"
        dns_server.set_a(target, ["127.0.0.2"] if i == 0 else [f"127.1.{i % 250}.{j + 1}" for j in range(5)])
        records.append((target, port if i == 0 else 9))
    dns_server.set_srv("_t.x", records)
    options = PoolOptions(start_timeout=60.0, backoff_base=0.01, backoff_max=0.5)
    with RemoteTargetBackend("srv://_t.x", nameserver=dns_server.address, options=options) as backend:
        assert backend.healthy_servers == 1
        assert len(backend.pool.members) == 256
        assert dns_server.queries <= 2 * (1 + 2 * 256)  # SRV, then A and AAAA of 256 targets (UDP, maybe TCP)
