"""Feature requests from the trainer's side: capture, failover, refusal at join, weights once."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from aiohttp import web
from target_support import served

from eagle3_target.client import FeatureError, Features, PoolOptions, RemoteTargetBackend
from eagle3_target.protocol import wire
from eagle3_target.protocol.contract import FEATURES_HEADER
from eagle3_target.protocol.families import family
from eagle3_target.server.app import TargetServer
from eagle3_target.server.runners.base import Capture, ForwardInputs
from eagle3_target.server.runners.synthetic import SyntheticRunner

from .client_support import assert_batch_matches, draft_vocab, expected, make_batch, wait_until

pytestmark = pytest.mark.timeout(120)

FAST = PoolOptions(deadline=10.0, start_timeout=5.0, backoff_base=0.01, backoff_max=0.2)
DFLASH = Features(layers=(1, 9, 17, 25, -1))


def direct(features: Features, ids, mask) -> dict[str, torch.Tensor]:
    got = SyntheticRunner().capture(ForwardInputs(ids, mask), Capture.of(features))
    want = {"hidden_states": got.hidden_states, "final_hidden": got.final_hidden, "logits": got.logits}
    return {k: v for k, v in want.items() if v is not None}


def test_capture_returns_what_the_runner_captured_and_generate_batch_still_works(farm):
    url = farm.start("127.0.0.2")
    features = Features(layers=(3, -1), final_hidden=True, logits="full")
    batches = [make_batch(seed) for seed in range(4)]
    with RemoteTargetBackend(url, options=FAST, features=features) as backend:
        assert backend.features == features
        got = list(backend.prefetch_captures(batches, depth=2))  # no vocab mapping needed
        vocab = draft_vocab()
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        batch = backend.generate_batch(*batches[0])
    for have, (ids, mask, _) in zip(got, batches, strict=True):
        want = direct(features, ids, mask)
        assert list(have) == list(want)
        assert all(torch.equal(have[k], want[k]) for k in want)
    assert_batch_matches(batch, expected(SyntheticRunner(), vocab, *batches[0]), batches[0][1])


def test_a_server_that_cannot_serve_the_features_is_refused_at_join(farm):
    url = farm.start("127.0.0.2", num_hidden_layers=8)
    with pytest.raises(FeatureError, match=r"layers \[9, 17, 25\] are out of range"):
        RemoteTargetBackend(url, options=FAST, features=DFLASH)  # a target of 8 layers
    layers_only = farm.start("127.0.0.3", loader=lambda: layers_only_runner())
    with pytest.raises(FeatureError, match="cannot capture final_hidden, logits"):
        RemoteTargetBackend(layers_only, options=FAST, features=family("eagle1").ask([], 32))


def layers_only_runner() -> SyntheticRunner:
    runner = SyntheticRunner()
    runner.info = dataclasses.replace(runner.info, features=("layers",))
    return runner


class Lying(TargetServer):
    """Offers every feature, answers every /generate with a blob missing "final_hidden"."""

    async def generate(self, request: web.Request) -> web.StreamResponse:
        text = request.headers[FEATURES_HEADER]
        blob = wire.encode({"hidden_states": torch.zeros(1)})
        return web.Response(body=blob, headers={FEATURES_HEADER: text})


def test_an_incomplete_reply_fails_over_to_a_good_server(farm):
    bad = farm.start("127.0.0.2", server_type=Lying)
    good = farm.start("127.0.0.3")
    features = Features(layers=(2,), final_hidden=True)
    ids, mask, loss = make_batch(1)
    with RemoteTargetBackend([bad, good], options=FAST, features=features) as backend:
        backend.wait_for_servers(10)
        results = [backend.capture(ids, mask, loss) for _ in range(3)]
        assert backend.pool.failovers >= 1
    for got in results:
        assert torch.equal(got["final_hidden"], direct(features, ids, mask)["final_hidden"])
    wait_until(lambda: served(farm.server(good), "generate", "200") == 3)


def test_target_weight_is_fetched_once_and_checked(farm):
    url = farm.start("127.0.0.2")
    runner = SyntheticRunner()
    with RemoteTargetBackend(url, options=FAST, features=DFLASH) as backend:
        head = backend.target_weight("lm_head")
        assert backend.target_weight("lm_head") is head
        assert torch.equal(head, runner.weight("lm_head"))
        assert torch.equal(backend.target_weight("input_embeddings"), runner.input_embeddings())
        wait_until(lambda: served(farm.server(url), "weights", "200") == 2)  # counted after the body is sent
        with pytest.raises(Exception, match="weight_not_offered"):
            backend.target_weight("final_norm")  # the synthetic runner has no norm
        with pytest.raises(ValueError, match="unknown weight"):
            backend.target_weight("optimizer")


def test_packing_metadata_is_refused_before_sending_to_a_fleet_without_packing(farm):
    url = farm.start("127.0.0.2")
    ids, mask, loss = make_batch(1)
    with RemoteTargetBackend(url, options=FAST, features=DFLASH) as backend:
        with pytest.raises(ValueError, match="do not offer packing"):
            backend.capture(ids, mask, loss, position_ids=torch.zeros_like(ids))
        assert served(farm.server(url), "generate", "200") == 0


def test_every_family_request_is_served_by_the_synthetic_runner(farm):
    url = farm.start("127.0.0.2")
    ids, mask, loss = make_batch(2)
    for name in ("dflash", "jetspec", "dspark", "peagle", "eagle1"):
        features = family(name).ask([1, 15, 28], 32)
        with RemoteTargetBackend(url, options=FAST, features=features) as backend:
            got = backend.capture(ids, mask, loss)
        assert tuple(got) == features.reply_keys, name
        doc = json.loads(features.to_header())
        assert Features.from_header(json.dumps(doc)) == features
