"""Membership follows DNS while batches flow: 2 -> 4 -> 1 pods, no batch lost, new pods get the mapping first."""

from __future__ import annotations

import logging
import threading

import pytest
from target_support import free_port, served

from eagle3_target.client import PoolOptions, RemoteTargetBackend
from eagle3_target.server.runners.synthetic import SyntheticRunner

from .client_support import assert_batch_matches, draft_vocab, expected, make_batch, wait_until

pytestmark = pytest.mark.timeout(90)

SERVICE = "targets.team.svc.cluster.local"
OPTIONS = PoolOptions(
    resolve_interval=0.2,
    min_resolve_gap=0.1,
    deadline=20,
    start_timeout=20,
    backoff_base=0.01,
    backoff_max=0.2,
    heartbeat_interval=0.3,
)


def generate_count(farm, url: str, code: str) -> float:
    return served(farm.server(url), "generate", code)


def run_membership_changes(farm, dns_server, spec: str, set_pods, caplog) -> None:
    caplog.set_level(logging.INFO, logger="eagle3_target.client.membership")
    runner, vocab = SyntheticRunner(), draft_vocab()
    hosts = [f"127.0.0.{i}" for i in range(2, 6)]
    urls = set_pods(hosts[:2])
    with RemoteTargetBackend(spec, nameserver=dns_server.address, options=OPTIONS) as backend:
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        wait_until(lambda: backend.healthy_servers == 2)  # the backend returns once one server is healthy
        inputs = [make_batch(seed) for seed in range(60)]
        stream = backend.prefetch(inputs, depth=4)
        for index, (got, sent) in enumerate(zip(stream, inputs, strict=True)):
            assert_batch_matches(got, expected(runner, vocab, *sent), sent[1])
            if index == 10:
                urls = set_pods(hosts)
                wait_until(lambda: backend.healthy_servers == 4)
            if index == 35:
                set_pods(hosts[:1])
                wait_until(lambda: len(backend.pool.members) == 1)
        for url in urls[2:]:  # joined mid-run: served batches, and never before receiving the mapping
            assert generate_count(farm, url, "200") > 0
            assert generate_count(farm, url, "409") == 0
        for url in urls[1:]:  # drained: our session there was ended, the server itself keeps running
            wait_until(lambda url=url: backend.session_id not in farm.server(url).service.sessions)
        assert backend.session_id in farm.server(urls[0]).service.sessions
        assert backend.pool.describe_members() == f"{urls[0]} healthy"
    # What an operator reads in the trainer's log, one line per change.
    assert all(f"{url} is healthy" in caplog.messages for url in urls), caplog.messages
    assert all(f"new target server {url}" in caplog.messages for url in urls[2:]), caplog.messages
    assert all(f"target server {url} left DNS; draining" in caplog.messages for url in urls[1:]), (
        caplog.messages
    )


def test_a_records_two_four_one(farm, dns_server, caplog):
    port = free_port()
    urls = {
        host: farm.start(host, port, forward_delay=0.01) for host in (f"127.0.0.{i}" for i in range(2, 6))
    }

    def set_pods(hosts):
        dns_server.set_a(SERVICE, hosts)
        return [urls[h] for h in hosts]

    run_membership_changes(farm, dns_server, f"dns://{SERVICE}:{port}", set_pods, caplog)


def test_srv_records_two_four_one(farm, dns_server, caplog):
    # hostNetwork: each pod has its own port, which only SRV records carry.
    urls = {host: farm.start(host, forward_delay=0.01) for host in (f"127.0.0.{i}" for i in range(2, 6))}
    for index, host in enumerate(urls):
        dns_server.set_a(f"pod-{index}.{SERVICE}", [host])

    def set_pods(hosts):
        records = [(f"pod-{list(urls).index(h)}.{SERVICE}", int(urls[h].rsplit(":", 1)[1])) for h in hosts]
        dns_server.set_srv(f"_http._tcp.{SERVICE}", records)
        return [urls[h] for h in hosts]

    run_membership_changes(farm, dns_server, f"srv://_http._tcp.{SERVICE}", set_pods, caplog)


def test_backend_waits_for_a_name_that_resolves_late(farm, dns_server):
    url = farm.start("127.0.0.2")
    port = int(url.rsplit(":", 1)[1])
    threading.Timer(0.7, dns_server.set_a, (SERVICE, ["127.0.0.2"])).start()
    with RemoteTargetBackend(
        f"dns://{SERVICE}:{port}", nameserver=dns_server.address, options=OPTIONS
    ) as backend:
        assert backend.healthy_servers == 1


def test_a_connection_error_triggers_resolution_at_once(farm, dns_server):
    runner, vocab = SyntheticRunner(), draft_vocab()
    port = free_port()
    old, new = farm.start("127.0.0.2", port), farm.start("127.0.0.3", port)
    dns_server.set_a(SERVICE, ["127.0.0.2"])
    options = PoolOptions(
        resolve_interval=3600,
        min_resolve_gap=0.1,
        deadline=20,
        start_timeout=20,
        backoff_base=0.01,
        backoff_max=0.2,
    )
    with RemoteTargetBackend(
        f"dns://{SERVICE}:{port}", nameserver=dns_server.address, options=options
    ) as backend:
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        backend.generate_batch(*make_batch(0))
        dns_server.set_a(SERVICE, ["127.0.0.3"])  # the pod moved; the timer alone would notice in an hour
        farm.stop(old)
        inputs = make_batch(1)
        assert_batch_matches(backend.generate_batch(*inputs), expected(runner, vocab, *inputs), inputs[1])
        assert [m.url for m in backend.pool.healthy()] == [new]


def test_an_ipv6_only_fleet_serves_batches(farm, dns_server_v6):
    """DNS over IPv6, AAAA records only, a server on ::1: the client finds it, brackets it and gets batches."""
    url = farm.start("::1")
    port = int(url.rpartition(":")[2])
    dns_server_v6.set_aaaa(SERVICE, ["::1"])
    runner, vocab = SyntheticRunner(), draft_vocab()
    with RemoteTargetBackend(
        f"dns://{SERVICE}:{port}", nameserver=dns_server_v6.address, options=OPTIONS
    ) as backend:
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        inputs = make_batch(0)
        assert_batch_matches(backend.generate_batch(*inputs), expected(runner, vocab, *inputs), inputs[1])
        assert backend.pool.describe_members() == f"http://[::1]:{port} healthy"
    assert generate_count(farm, url, "200") == 1
