"""The synchronous backend against real in-process servers: content, ordering, errors, sessions."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch
from target_support import served

from eagle3_target.client import (
    BatchFailedError,
    ModelMismatchError,
    PoolOptions,
    RemoteTargetBackend,
    RequestRejected,
    ServerError,
)
from eagle3_target.server.options import ServerOptions
from eagle3_target.server.runners.synthetic import SyntheticRunner

from .client_support import assert_batch_matches, draft_vocab, expected, make_batch, wait_until

pytestmark = pytest.mark.timeout(60)

FAST = PoolOptions(deadline=10.0, start_timeout=10.0, backoff_base=0.01, backoff_max=0.2)


def test_batches_match_the_reference_and_embeddings_are_cached(farm):
    urls = [farm.start("127.0.0.2"), farm.start("127.0.0.3")]
    runner, vocab = SyntheticRunner(), draft_vocab()
    with RemoteTargetBackend(urls, options=FAST) as backend:
        info = backend.model_info()
        assert (
            info["hidden_size"] == 64 and info["vocab_size"] == 512 and info["aux_layer_ids"] == [1, 15, 28]
        )
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        for seed in range(6):
            inputs = make_batch(seed)
            batch = backend.generate_batch(*inputs)
            assert_batch_matches(batch, expected(runner, vocab, *inputs), inputs[1])
            assert batch.target_probs.shape == (2, 16, 96)
        embeddings = backend.get_input_embeddings()
        assert torch.equal(embeddings.weight, runner.input_embeddings())
        assert not embeddings.weight.requires_grad
        assert backend.get_input_embeddings() is embeddings
        # Both servers took part (least-loaded with fair tie-breaking).
        answered = [served(farm.server(u), "generate", "200") for u in urls]
        assert all(n > 0 for n in answered), answered


def test_prefetch_returns_results_in_submission_order(farm):
    # Different forward delays make later submissions finish first.
    urls = [farm.start(f"127.0.0.{i + 2}", forward_delay=delay) for i, delay in enumerate((0.15, 0.0, 0.05))]
    runner, vocab = SyntheticRunner(), draft_vocab()
    with RemoteTargetBackend(",".join(urls), options=FAST) as backend:
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        assert backend.wait_for_servers(timeout=15) == 3  # the constructor returns once one server is healthy
        inputs = [make_batch(seed) for seed in range(12)]
        for got, sent in zip(backend.prefetch(inputs, depth=3), inputs, strict=True):
            assert_batch_matches(got, expected(runner, vocab, *sent), sent[1])
        handles = [backend.generate_batch_async(*sent) for sent in inputs[:3]]
        for handle, sent in zip(reversed(handles), reversed(inputs[:3]), strict=False):
            assert_batch_matches(handle.result(timeout=10), expected(runner, vocab, *sent), sent[1])


def test_servers_with_different_models_are_refused(farm):
    same = farm.start("127.0.0.2")
    other = farm.start("127.0.0.3", hidden_size=32)
    with pytest.raises(ModelMismatchError) as error:
        RemoteTargetBackend([same, other], options=FAST)
    assert same in str(error.value) and other in str(error.value) and "hidden_size=32" in str(error.value)


def test_close_ends_only_our_session(farm):
    url = farm.start("127.0.0.2")
    vocab = draft_vocab()
    other = RemoteTargetBackend(url, options=FAST)
    other.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
    with RemoteTargetBackend(url, options=FAST) as backend:
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        backend.generate_batch(*make_batch(1))
        sessions = farm.server(url).service.sessions
        assert backend.session_id in sessions and other.session_id in sessions
    assert backend.session_id not in sessions and other.session_id in sessions
    other.generate_batch(*make_batch(2))  # the server still serves the other trainer
    other.close()
    with pytest.raises(RuntimeError, match="closed"):
        other.generate_batch(*make_batch(3))


def test_heartbeats_keep_our_session_alive(farm):
    url = farm.start("127.0.0.2", options=ServerOptions(session_ttl=0.6))
    options = PoolOptions(heartbeat_interval=0.1, deadline=10.0, start_timeout=10.0)
    with RemoteTargetBackend(url, options=options) as backend:
        server = farm.server(url)
        # Ten heartbeats take over a second, longer than the TTL: only heartbeats keep the session.
        wait_until(lambda: served(server, "heartbeat", "200") >= 10)
        assert server.service.sessions.expire() == [] and backend.session_id in server.service.sessions


def test_restarted_server_gets_the_vocab_mapping_again(farm):
    url = farm.start("127.0.0.2")
    host, port = url.removeprefix("http://").split(":")
    runner, vocab = SyntheticRunner(), draft_vocab()
    with RemoteTargetBackend(url, options=FAST) as backend:
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        backend.generate_batch(*make_batch(0))
        farm.stop(url)
        farm.start(host, int(port))  # a fresh process: our session and mapping are gone
        inputs = make_batch(5)
        assert_batch_matches(backend.generate_batch(*inputs), expected(runner, vocab, *inputs), inputs[1])


def test_client_errors_are_raised_at_once_not_retried(farm):
    url = farm.start("127.0.0.2")
    vocab = draft_vocab()
    with RemoteTargetBackend(url, options=FAST) as backend:
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        ids, mask, loss = make_batch(0)
        with pytest.raises(ServerError) as error:
            backend.generate_batch(ids + 10_000, mask, loss)
        assert error.value.status == 422 and error.value.error == "token_out_of_range"
        assert served(farm.server(url), "generate", "422") == 1
        assert backend.healthy_servers == 1  # a bad batch does not make the server look sick
        # NeMo's signature with an image-text batch's keys: refused before anything is sent
        with pytest.raises(TypeError, match="generate_batch takes no pixel_values: images go with capture"):
            backend.generate_batch(ids, mask, loss, pixel_values=torch.zeros(4, 8))
        assert served(farm.server(url), "generate", "422") == 1


def test_a_mapping_every_server_refuses_is_raised_in_the_servers_words_and_quarantines_none(farm):
    urls = [farm.start("127.0.0.2"), farm.start("127.0.0.3")]
    vocab = draft_vocab()
    with RemoteTargetBackend(urls, options=FAST) as backend:
        assert backend.wait_for_servers(timeout=15) == 2
        with pytest.raises(RequestRejected) as error:
            backend.set_vocab_mapping(vocab.selected_token_ids + 10_000, vocab.selected_token_mask)
        rejected = error.value
        assert (rejected.url, rejected.path) == (urls[0], "set_vocab_mapping")  # the first server's words
        assert (rejected.status, rejected.error) == (422, "token_out_of_range")
        assert "10000" in rejected.detail, rejected.detail
        assert backend.healthy_servers == 2  # the mapping was at fault, not the servers


def test_a_server_refusing_batches_another_serves_is_the_one_quarantined(farm, caplog):
    """A 4xx about the request is the request's fault only if every server says so: here a server with a
    16-token cap refuses 32-token batches the other serves, so it is the odd one out."""
    caplog.set_level(logging.WARNING, logger="eagle3_target.client")
    strict = farm.start("127.0.0.2", options=ServerOptions(max_batch_tokens=16))
    lenient = farm.start("127.0.0.3")
    runner, vocab = SyntheticRunner(), draft_vocab()
    with RemoteTargetBackend([strict, lenient], options=FAST) as backend:
        assert backend.wait_for_servers(timeout=15) == 2
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        for seed in range(4):  # dispatch takes turns: some go to the strict server first
            inputs = make_batch(seed)
            assert_batch_matches(backend.generate_batch(*inputs), expected(runner, vocab, *inputs), inputs[1])
        refused = served(farm.server(strict), "generate", "413")
        assert refused >= 1 and backend.pool.failovers == refused  # each refusal moved on once
        assert f"quarantining {strict}: ServerFault: refused a request {lenient} served" in caplog.messages


def test_generate_before_vocab_mapping_is_a_clear_error(farm):
    url = farm.start("127.0.0.2")
    with (
        RemoteTargetBackend(url, options=FAST) as backend,
        pytest.raises(ServerError, match="no_vocab_mapping"),
    ):
        backend.generate_batch(*make_batch(0))


def test_deadline_names_every_server_tried(farm):
    urls = [farm.start("127.0.0.2"), farm.start("127.0.0.3")]
    vocab = draft_vocab()
    options = PoolOptions(deadline=1.5, start_timeout=5.0, backoff_base=0.01, backoff_max=0.1)
    with RemoteTargetBackend(urls, options=options) as backend:
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        for url in urls:
            farm.stop(url)
        start = time.monotonic()
        with pytest.raises(BatchFailedError) as error:
            backend.generate_batch(*make_batch(0))
        assert time.monotonic() - start < 5
        assert all(url in str(error.value) for url in urls), str(error.value)
        assert str(error.value).startswith("/generate found no server within 2s; tried: ")
        with pytest.raises(BatchFailedError, match="^/input_embeddings found no server within 2s; tried: "):
            backend.get_input_embeddings()
        with pytest.raises(BatchFailedError, match="^/weights/lm_head found no server within 2s; tried: "):
            backend.target_weight("lm_head")


def test_auth_token_from_the_environment(farm, tmp_path, monkeypatch):
    url = farm.start("127.0.0.2", options=ServerOptions(auth_token="s3cret"))
    vocab = draft_vocab()
    with pytest.raises(ServerError, match="401"):
        RemoteTargetBackend(url, options=FAST)
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    monkeypatch.setenv("EAGLE3_TARGET_AUTH_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("EAGLE3_TARGET_SERVICE", url)
    with RemoteTargetBackend(options=FAST) as backend:
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        backend.generate_batch(*make_batch(0))


def test_a_server_still_loading_is_waited_for(farm):
    """The constructor waits while the one server answers /health with 503, and returns once it is ready."""
    loaded = threading.Event()

    def slow_load():
        assert loaded.wait(30), "the test never let the model load"
        return SyntheticRunner()

    url = farm.start("127.0.0.2", loader=slow_load, wait=False)
    server = farm.server(url)
    made: list[RemoteTargetBackend] = []
    waiting = threading.Thread(target=lambda: made.append(RemoteTargetBackend(url, options=FAST)))
    waiting.start()
    try:
        wait_until(lambda: served(server, "health", "503") >= 3)  # asked, and asked again, while loading
        assert waiting.is_alive() and not made
    finally:
        loaded.set()
        waiting.join(30)
    runner, vocab = SyntheticRunner(), draft_vocab()
    with made[0] as backend:
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        inputs = make_batch(0)
        assert_batch_matches(backend.generate_batch(*inputs), expected(runner, vocab, *inputs), inputs[1])


def test_waiting_for_servers_waits_for_those_still_joining_and_names_the_unhealthy(farm, caplog):
    """wait_for_servers gives up on a server still loading after its timeout, saying which servers are not
    healthy and why; once that server loads, it returns as the server joins, quietly."""
    caplog.set_level(logging.WARNING, logger="eagle3_target.client")
    loaded = threading.Event()

    def slow_load():
        assert loaded.wait(30), "the test never let the model load"
        return SyntheticRunner()

    ready = farm.start("127.0.0.2")
    loading = farm.start("127.0.0.3", loader=slow_load, wait=False)
    with RemoteTargetBackend([ready, loading], options=FAST) as backend:
        try:
            assert backend.wait_for_servers(timeout=0.5) == 1  # the loading one cannot join before we say so
        finally:
            loaded.set()
        why = f"ServerError: {loading}/health: HTTP 503 loading: not ready"
        assert caplog.messages == [
            f"1 of 2 target servers healthy: {ready} healthy; {loading} joining ({why})"
        ]
        caplog.clear()
        assert backend.wait_for_servers(timeout=60) == 2
        assert caplog.messages == []


def test_a_server_gone_between_heartbeats_is_quarantined_with_the_reason_and_rejoins(farm, caplog):
    caplog.set_level(logging.WARNING, logger="eagle3_target.client")
    url = farm.start("127.0.0.2")
    options = PoolOptions(start_timeout=10.0, backoff_base=0.01, backoff_max=0.2, heartbeat_interval=0.05)
    with RemoteTargetBackend(url, options=options) as backend:
        assert served(farm.server(url), "model_info", "200") == 1  # the join used the first probe's answer
        farm.stop(url)
        wait_until(lambda: backend.healthy_servers == 0)
        said = [m.removeprefix(f"quarantining {url}: ") for m in caplog.messages if url in m]
        # refused, or cut off if a heartbeat was in flight as the server stopped
        refused = f"cannot connect to {url.removeprefix('http://')}: Connection refused"
        assert len(said) == 1 and said[0].startswith((refused, "ServerDisconnectedError")), said
        farm.start("127.0.0.2", int(url.rsplit(":", 1)[1]))  # back: it joins again, through /health
        wait_until(lambda: backend.healthy_servers == 1)
