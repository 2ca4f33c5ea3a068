"""Feature requests from the trainer's side: capture, failover, refusal at join, weights once."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from aiohttp import web
from target_support import served

from eagle3_target.client import BatchInputs, FeatureError, Features, PoolOptions, RemoteTargetBackend
from eagle3_target.client.capture import request_body
from eagle3_target.client.inputs import batch_inputs
from eagle3_target.client.nemo.registry import families
from eagle3_target.protocol import wire
from eagle3_target.protocol.contract import FEATURES_HEADER, REQUEST_ID_HEADER
from eagle3_target.protocol.families import family
from eagle3_target.protocol.features import LOGITS_DRAFT_PROBS
from eagle3_target.protocol.model_info import ModelInfo
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
        got = list(
            backend.prefetch_captures((BatchInputs(*b) for b in batches), depth=2)
        )  # no vocab mapping needed
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
        results = [backend.capture(BatchInputs(ids, mask, loss)) for _ in range(3)]
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
            backend.capture(BatchInputs(ids, mask, loss, position_ids=torch.zeros_like(ids)))
        assert served(farm.server(url), "generate", "200") == 0


def test_every_family_request_is_served_by_the_synthetic_runner(farm):
    url = farm.start("127.0.0.2")
    ids, mask, loss = make_batch(2)
    vocab = draft_vocab()
    for name, found in families().items():  # the registry's: a family added is checked here too
        features = found.request.ask([1, 15, 28], 32)
        if (
            features.image_mask
        ):  # an image-text target's: a text server refuses it (test_vlm_serving serves it)
            refused = pytest.raises(FeatureError, match="cannot capture image_mask")
            with refused, RemoteTargetBackend(url, options=FAST, features=features) as backend:
                backend.capture(BatchInputs(ids, mask, loss))
            continue
        with RemoteTargetBackend(url, options=FAST, features=features) as backend:
            if features.logits == LOGITS_DRAFT_PROBS:  # EAGLE-3's supervision is over the draft vocabulary
                backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
            got = backend.capture(BatchInputs(ids, mask, loss))
        assert tuple(got) == features.reply_keys, name
        doc = json.loads(features.to_header())
        assert Features.from_header(json.dumps(doc)) == features


class Recording(TargetServer):
    """Keeps each /generate's headers and body."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked: list[tuple[dict[str, str], bytes]] = []

    async def generate(self, request: web.Request) -> web.StreamResponse:
        self.asked.append(({k.lower(): v for k, v in request.headers.items()}, bytes(await request.read())))
        return await super().generate(request)


def stock_runner() -> SyntheticRunner:
    """A server whose /model_info reads as a stock NeMo server's: no encodings, features or weights."""
    runner = SyntheticRunner()
    runner.info = dataclasses.replace(runner.info, encodings=("nemo",), features=(), weights=())
    return runner


@pytest.mark.parametrize("stock", [True, False], ids=["stock-nemo", "ours"])
def test_eagle3s_feature_request_is_sent_as_nemos_generate_and_equals_generate_batch(farm, stock):
    url = farm.start("127.0.0.2", server_type=Recording, loader=stock_runner if stock else None)
    eagle3, (ids, mask, loss), vocab = family("eagle3"), make_batch(3), draft_vocab()
    with RemoteTargetBackend(
        url, options=FAST, features=lambda info: eagle3.ask(info.aux_layer_ids, info.num_hidden_layers)
    ) as backend:
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        batch = backend.generate_batch(ids, mask, loss)
        got = backend.capture(BatchInputs(ids, mask, loss))
        assert backend.encodings[url] == ("nemo" if stock else "logits")
    assert tuple(got) == eagle3.ask([1, 15, 28], 32).reply_keys
    assert torch.equal(got.pop("hidden_states"), batch.aux_hidden_states)
    assert all(torch.equal(value, getattr(batch, key)) for key, value in got.items())
    (generate_headers, generate_body), (capture_headers, capture_body) = farm.server(url).asked
    assert capture_body == generate_body  # the bytes generate_batch sends, NeMo's own request
    request_id = REQUEST_ID_HEADER.lower()
    assert {k: v for k, v in capture_headers.items() if k != request_id} == {
        k: v for k, v in generate_headers.items() if k != request_id
    }
    assert FEATURES_HEADER.lower() not in capture_headers
    other_layers = eagle3.ask([2, 3, 4], 32)  # not the server's aux layers: a feature request proper
    if stock:
        with pytest.raises(FeatureError, match="offers no feature requests"):
            RemoteTargetBackend(url, options=FAST, features=other_layers)
        return
    with RemoteTargetBackend(url, options=FAST, features=other_layers) as backend:
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        assert tuple(backend.capture(BatchInputs(ids, mask, loss))) == other_layers.reply_keys
    assert farm.server(url).asked[-1][0][FEATURES_HEADER.lower()] == other_layers.to_header()


def test_a_dataloader_batch_is_read_as_the_request_nemos_loops_need():
    """batch_inputs: packing metadata only with seq_lens (doc_remaining kept on the trainer), images without Nones."""
    ids, mask, loss = make_batch(4)
    grid = torch.tensor([[1, 2, 2]])
    packed = dict(input_ids=ids, attention_mask=mask, loss_mask=loss, position_ids=torch.zeros_like(ids))
    packed |= dict(seq_lens=torch.tensor([[ids.shape[1]]] * 2), doc_remaining=torch.ones_like(ids))
    inputs = batch_inputs({**packed, "pixel_values": None, "image_grid_thw": grid})
    assert inputs.doc_remaining is packed["doc_remaining"] and inputs.media == {"image_grid_thw": grid}
    offering = ModelInfo(8, 64, 512, (1, 3, 4), features=("packing",), modalities=("text", "image"))
    body = request_body(offering, inputs)
    assert list(body) == [
        "input_ids",
        "attention_mask",
        "loss_mask",
        "position_ids",
        "seq_lens",
        "image_grid_thw",
    ]
    unpacked = batch_inputs(
        {k: packed[k] for k in ("input_ids", "attention_mask", "loss_mask", "position_ids")}
    )
    assert unpacked.packing == {"position_ids": None, "seq_lens": None} and unpacked.media == {}
    assert list(request_body(None, unpacked)) == ["input_ids", "attention_mask", "loss_mask"]
