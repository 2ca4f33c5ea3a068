"""kill -9 of a server mid-run: every batch still comes back exactly once, in order, with the right content."""

from __future__ import annotations

import re
import signal
import time

import pytest

from eagle3_target.client import PoolOptions, RemoteTargetBackend
from eagle3_target.server.runners.synthetic import SyntheticRunner

from .client_support import assert_batch_matches, draft_vocab, expected, make_batch, wait_until

pytestmark = pytest.mark.timeout(120)


def test_killing_a_server_mid_run_loses_and_duplicates_nothing(spawn_server):
    hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    servers = [spawn_server(host, forward_delay=0.05) for host in hosts]
    options = PoolOptions(
        deadline=30, start_timeout=60, backoff_base=0.01, backoff_max=0.2, resolve_interval=0.5
    )
    runner, vocab = SyntheticRunner(dtype="float32"), draft_vocab()  # `serve` defaults to float32 on CPU
    with RemoteTargetBackend([s.url for s in servers], options=options) as backend:
        wait_until(lambda: backend.healthy_servers == 3, timeout=60)  # processes start in parallel
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        inputs = [make_batch(seed) for seed in range(40)]
        results = []
        for index, got in enumerate(backend.prefetch(inputs, depth=3)):
            results.append(got)
            if index == 10:
                servers[1].kill()  # requests to it are in flight now (depth 3 over 3 servers)
        assert len(results) == len(inputs)
        for got, sent in zip(results, inputs, strict=False):
            assert_batch_matches(got, expected(runner, vocab, *sent), sent[1])
        assert backend.pool.failovers >= 1  # the killed server held a batch, which went elsewhere
        assert backend.healthy_servers == 2
        assert servers[1].url in backend.pool.describe_members()  # still listed: quarantined, re-probed


def test_a_silent_server_costs_a_batch_the_hedge_threshold_not_the_request_timeout(spawn_server, caplog):
    """SIGSTOP keeps the server's sockets open and answers nothing, as a wedged GPU or stalled node does."""
    hosts = ["127.0.0.2", "127.0.0.3"]
    servers = [spawn_server(host, forward_delay=0.05) for host in hosts]
    options = PoolOptions(
        request_timeout=120, start_timeout=60, hedge_after=3.0, backoff_base=0.01, backoff_max=0.5
    )
    runner, vocab = SyntheticRunner(dtype="float32"), draft_vocab()
    with RemoteTargetBackend([s.url for s in servers], options=options) as backend:
        wait_until(lambda: backend.healthy_servers == 2, timeout=60)
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        inputs = [make_batch(seed) for seed in range(24)]
        results, gaps, threshold = [], [], None
        last = time.monotonic()
        try:
            for index, got in enumerate(backend.prefetch(inputs, depth=2)):
                now = time.monotonic()
                results.append(got)
                gaps.append(now - last)
                last = now
                if index == 5:
                    threshold = backend.pool.hedge_threshold()
                    servers[1].process.send_signal(signal.SIGSTOP)  # it holds a batch now (depth 2)
        finally:
            servers[1].process.send_signal(signal.SIGCONT)
        assert len(results) == len(inputs)
        for got, sent in zip(results, inputs, strict=True):
            assert_batch_matches(got, expected(runner, vocab, *sent), sent[1])
        assert backend.pool.hedges >= 1
        assert max(gaps) < threshold + 5.0, (max(gaps), threshold)  # 120 s (the request timeout) before
        silent = re.escape(servers[1].url)
        hedged = rf"{silent} has not answered /generate for \d+\.\d+s; marking it unhealthy until /health answers, "
        said = [r.getMessage() for r in caplog.records]
        assert any(re.fullmatch(hedged + "re-sending the request to another server", m) for m in said), said
        assert any(
            re.fullmatch(rf"quarantining {silent}: TimeoutError: silent for \d+\.\ds on /generate", m)
            for m in said
        )
        wait_until(lambda: backend.healthy_servers == 2, timeout=60)  # it rejoins once /health answers
