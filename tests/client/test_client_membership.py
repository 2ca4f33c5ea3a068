"""Promises of docs/client.md about who is in the pool: DNS failures, late joiners, one request per server."""

from __future__ import annotations

import logging

import pytest
from target_support import served

from eagle3_target.client import PoolOptions, RemoteTargetBackend
from eagle3_target.server.app import TargetServer
from eagle3_target.server.runners.synthetic import SyntheticRunner

from .client_support import assert_batch_matches, draft_vocab, expected, make_batch, wait_until

pytestmark = pytest.mark.timeout(90)

SERVICE = "targets.team.svc.cluster.local"
OPTIONS = PoolOptions(
    resolve_interval=0.1,
    min_resolve_gap=0.05,
    deadline=20,
    start_timeout=20,
    backoff_base=0.01,
    backoff_max=0.2,
)


def same_port_servers(farm, hosts: list[str], **runner_options) -> list[str]:
    """Servers on one port, as a headless Service's pods: the first is given a free one, the others bind it too."""
    first = farm.start(hosts[0], **runner_options.get(hosts[0], {}))
    port = int(first.rsplit(":", 1)[1])
    return [first, *(farm.start(host, port, **runner_options.get(host, {})) for host in hosts[1:])]


def test_a_failed_dns_lookup_changes_nothing(farm, dns_server, caplog):
    """The name stops resolving (NXDOMAIN) while both pods still serve: the pool keeps both, and batches go on
    to both of them."""
    caplog.set_level(logging.WARNING, logger="eagle3_target.client")
    urls = same_port_servers(farm, ["127.0.0.2", "127.0.0.3"])
    port = urls[0].rsplit(":", 1)[1]
    dns_server.set_a(SERVICE, ["127.0.0.2", "127.0.0.3"])
    runner, vocab = SyntheticRunner(), draft_vocab()
    with RemoteTargetBackend(
        f"dns://{SERVICE}:{port}", nameserver=dns_server.address, options=OPTIONS
    ) as backend:
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        wait_until(lambda: backend.healthy_servers == 2)
        dns_server.remove(SERVICE)
        asked = dns_server.queries
        wait_until(lambda: dns_server.queries >= asked + 10)  # five re-resolutions (A and AAAA each) failed
        failed = "re-resolving target endpoints failed (keeping 2 servers): "
        assert any(line.startswith(failed) and SERVICE in line for line in caplog.messages), caplog.messages
        assert backend.healthy_servers == 2
        before = [served(farm.server(url), "generate", "200") for url in urls]
        for seed in range(6):
            inputs = make_batch(seed)
            assert_batch_matches(backend.generate_batch(*inputs), expected(runner, vocab, *inputs), inputs[1])
        after = [served(farm.server(url), "generate", "200") for url in urls]
        assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)


def test_a_server_that_joins_later_with_another_model_is_refused(farm, dns_server, caplog):
    caplog.set_level(logging.ERROR, logger="eagle3_target.client")
    good, other = same_port_servers(farm, ["127.0.0.2", "127.0.0.3"], **{"127.0.0.3": {"hidden_size": 32}})
    port = good.rsplit(":", 1)[1]
    dns_server.set_a(SERVICE, ["127.0.0.2"])
    runner, vocab = SyntheticRunner(), draft_vocab()
    with RemoteTargetBackend(
        f"dns://{SERVICE}:{port}", nameserver=dns_server.address, options=OPTIONS
    ) as backend:
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        dns_server.set_a(SERVICE, ["127.0.0.2", "127.0.0.3"])  # a pod with another model joins the Service
        wait_until(lambda: any(m.startswith(f"refusing {other}: ") for m in caplog.messages))
        assert "hidden_size" in caplog.text
        members = backend.pool.describe_members()
        assert (
            "hidden_size" in members.partition(f"{other} refused (")[2]
            and members.count(f"{other} refused") == 1
        )
        for seed in range(4):
            inputs = make_batch(seed)
            assert_batch_matches(backend.generate_batch(*inputs), expected(runner, vocab, *inputs), inputs[1])
        assert backend.healthy_servers == 1
    assert served(farm.server(other), "generate", "200") == 0
    assert served(farm.server(other), "set_vocab_mapping", "200") == 0


class ConcurrencyCounting(TargetServer):
    """Counts the /generate requests it is handling at once, and the most it ever handled."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.now = self.most = 0

    async def generate(self, request):
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            return await super().generate(request)
        finally:
            self.now -= 1


def test_one_request_in_flight_per_server_by_default(farm):
    """max_in_flight=1, as NeMo: eight batches submitted at once reach each server one after another."""
    urls = [
        farm.start(h, server_type=ConcurrencyCounting, forward_delay=0.05) for h in ("127.0.0.2", "127.0.0.3")
    ]
    runner, vocab = SyntheticRunner(), draft_vocab()
    with RemoteTargetBackend(urls, options=OPTIONS) as backend:
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        assert backend.wait_for_servers(timeout=15) == 2
        inputs = [make_batch(seed) for seed in range(8)]
        handles = [backend.generate_batch_async(*sent) for sent in inputs]
        for handle, sent in zip(handles, inputs, strict=True):
            assert_batch_matches(handle.result(timeout=30), expected(runner, vocab, *sent), sent[1])
    servers = [farm.server(url) for url in urls]
    assert [s.most for s in servers] == [1, 1]
    assert sum(served(s, "generate", "200") for s in servers) == 8
