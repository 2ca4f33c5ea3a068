"""Feature requests on the server: each family's tensors bit for bit as NeMo's co-located target wrappers
compute them (HF runner, CPU float32), the synthetic runner's, the 4xx answers, and /weights/<name>."""

import dataclasses
import json

import pytest
import torch
from nemo_automodel.components.speculative.dflash.target import HFDFlashTargetModel
from nemo_automodel.components.speculative.dspark.target import HFDSparkTargetModel
from nemo_automodel.components.speculative.eagle.target import HFEagle3TargetModel, _shift_left_with_zero
from nemo_automodel.components.speculative.eagle.target_v12 import HFEagleTargetModel
from target_support import generate_body, serve, vocab_body

from eagle3_target.protocol import capture, wire
from eagle3_target.protocol.contract import ENCODING_HEADER, FEATURES_HEADER, NCCL_HEADER
from eagle3_target.protocol.families import family
from eagle3_target.protocol.features import Features
from eagle3_target.server.errors import InvalidInput
from eagle3_target.server.runners.base import Capture, ForwardInputs
from eagle3_target.server.runners.hf import HFRunner
from eagle3_target.server.runners.synthetic import SyntheticRunner
from eagle3_target.server.runners.tiny import build_tiny_llama

V, H, L = 512, 64, 8


def batch(seed: int = 1, rows: int = 2, seq: int = 12):
    ids = torch.randint(0, V, (rows, seq), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0  # a padded row
    loss = torch.randint(0, 2, ids.shape, generator=torch.Generator().manual_seed(seed + 1))
    return ids, mask, loss


async def ask(srv, features: Features | str, ids, mask=None, loss=None, **headers):
    text = features if isinstance(features, str) else features.to_header()
    async with srv.http.post(
        f"{srv.url}/generate", data=generate_body(ids, mask, loss), headers={FEATURES_HEADER: text, **headers}
    ) as resp:
        body = await resp.read()
        if resp.status != 200:
            return resp.status, json.loads(body)
        assert resp.headers[FEATURES_HEADER] == text
        return resp.status, wire.decode(bytearray(body))


def assert_equal(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key


@pytest.fixture
def tiny():
    return build_tiny_llama()


async def test_each_family_gets_nemo_wrappers_tensors_bit_for_bit(tiny):
    ids, mask, loss = batch()
    layers = [1, 3, 5, L - 1]
    async with serve(lambda: HFRunner(tiny, name="tiny")) as srv:
        dflash = HFDFlashTargetModel(tiny, layers, capture_logits=True).generate_batch(ids, mask, loss)
        _, got = await ask(srv, family("dflash").ask(layers, L), ids, mask, loss)
        assert_equal(got, {"hidden_states": dflash.hidden_states})
        _, got = await ask(srv, family("jetspec").ask(layers, L), ids, mask, loss)
        assert_equal(got, {"hidden_states": dflash.hidden_states, "logits": dflash.logits})

        spark_layers = [-1, 2, 4, L - 1]  # strictly increasing (NeMo's rule): the last layer comes last
        dspark = HFDSparkTargetModel(tiny, spark_layers).generate_batch(ids, mask, loss)
        _, got = await ask(srv, family("dspark").ask(spark_layers, L), ids, mask, loss)
        final = got["final_hidden"]
        assert torch.equal(torch.cat([got["hidden_states"], final], -1), dspark.target_hidden_states)
        assert torch.equal(final, dspark.target_last_hidden_states)

        eagle1 = HFEagleTargetModel(tiny).generate_batch(ids, mask, loss)
        _, got = await ask(srv, family("eagle1").ask([], L), ids, mask, loss)
        assert torch.equal(got["final_hidden"], eagle1.input_hidden_states)
        assert torch.equal(got["logits"], eagle1.target_logits)

        aux = [1, 3, 4]
        peagle = HFEagle3TargetModel(tiny, aux).generate_batch(ids, mask, loss)
        _, got = await ask(srv, family("peagle").ask(aux, L), ids, mask, loss)
        assert_equal(got, {"hidden_states": peagle.aux_hidden_states, "logits": peagle.logits})


async def test_any_capture_comes_shifted_as_nemo_shifts_it_when_asked(tiny):
    ids, mask, loss = batch()
    plain = Features(layers=(-1, 2), final_hidden=True, logits="full")
    every = dataclasses.replace(plain, shift=("hidden_states", "final_hidden", "logits"))
    one = dataclasses.replace(plain, shift=["final_hidden"])
    assert json.loads(every.to_header())["shift"] == ["hidden_states", "final_hidden", "logits"]
    assert json.loads(dataclasses.replace(plain, shift=True).to_header())["shift"] is True
    async with serve(lambda: HFRunner(tiny, name="tiny")) as srv:
        _, unshifted = await ask(srv, plain, ids, mask, loss)
        _, got = await ask(srv, every, ids, mask, loss)
        assert_equal(got, {k: _shift_left_with_zero(v) for k, v in unshifted.items()})
        _, got = await ask(srv, one, ids, mask, loss)
        assert_equal(got, {**unshifted, "final_hidden": _shift_left_with_zero(unshifted["final_hidden"])})


async def test_draft_probs_are_the_nemo_encodings_supervision(tiny):
    ids, mask, loss = batch()
    selected = torch.randperm(V, generator=torch.Generator().manual_seed(3))[:100]
    in_draft = torch.zeros(V, dtype=torch.bool)
    in_draft[selected] = True
    async with serve(lambda: HFRunner(tiny, name="tiny")) as srv:
        features = family("eagle3").ask(srv.server.service.model.runner.info.aux_layer_ids, L)
        status, body = await ask(srv, features, ids, mask, loss)
        assert status == 409 and body["error"] == "no_vocab_mapping"  # draft_probs need the mapping
        await srv.post("set_vocab_mapping", vocab_body(selected, in_draft))
        _, got = await ask(srv, features, ids, mask, loss)
        async with srv.http.post(f"{srv.url}/generate", data=generate_body(ids, mask, loss)) as resp:
            nemo = wire.decode(bytearray(await resp.read()))
        assert torch.equal(got.pop("hidden_states"), nemo.pop("aux_hidden_states"))
        assert_equal(got, nemo)


def test_a_capture_computes_nothing_past_what_it_asks(tiny):
    """Layers only: the forward stops after the last asked layer (no later layer, norm or lm_head runs)."""
    runner = HFRunner(tiny, name="tiny")
    calls = []
    for name, module in (("layer5", tiny.model.layers[5]), ("norm", tiny.model.norm), ("head", tiny.lm_head)):
        module.register_forward_hook(lambda *_, name=name: calls.append(name))
    ids, mask, _ = batch()
    got = runner.capture(ForwardInputs(ids, mask), Capture(layers=(4, -1)))
    assert calls == [] and got.logits is None and got.final_hidden is None
    got = runner.capture(ForwardInputs(ids, mask), Capture(layers=(1,), final_hidden=True))
    assert calls == ["layer5", "norm"] and got.logits is None
    want = tiny(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
    assert torch.equal(got.final_hidden, want)


def test_runners_refuse_packing_metadata_they_cannot_honour():
    """The hf runner honours it (tests/server/test_packing.py); the synthetic one cannot."""
    ids, mask, _ = batch()
    for runner in (SyntheticRunner(vocab_size=V),):
        for packed in (ForwardInputs(ids, mask, position_ids=mask), ForwardInputs(ids, mask, seq_lens=mask)):
            with pytest.raises(InvalidInput, match="cannot run packed sequences") as err:
                runner.capture(packed, Capture(layers=(1,)))
            assert err.value.error == "packing_not_offered"


def test_the_synthetic_runner_captures_too():
    runner = SyntheticRunner(vocab_size=V, hidden_size=16, num_hidden_layers=L)
    ids, mask, _ = batch()
    logits, aux, final = runner.forward_hidden(ids, mask)
    got = runner.capture(ForwardInputs(ids, mask), Capture(tuple(runner.info.aux_layer_ids), True, True))
    assert torch.equal(got.hidden_states, aux) and torch.equal(got.final_hidden, final)
    assert torch.equal(got.logits, logits)
    picked = runner.capture(ForwardInputs(ids, mask), Capture((-1, 6)))
    one = runner.capture(ForwardInputs(ids, mask), Capture((6,)))
    assert torch.equal(picked.hidden_states[..., 16:], one.hidden_states)
    assert not torch.equal(picked.hidden_states[..., :16], one.hidden_states)


class LayersOnly(SyntheticRunner):
    """An engine that can give decoder layers and nothing else."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.info = dataclasses.replace(self.info, features=("layers",))


async def test_bad_feature_requests_are_4xx_with_json_and_the_server_keeps_serving():
    ids = torch.zeros(2, 8, dtype=torch.long)
    options = dict(vocab_size=V, num_hidden_layers=L)
    async with serve(lambda: LayersOnly(**options)) as srv:
        cases = [
            (Features(layers=(L,)).to_header(), 422, "layer_out_of_range"),
            ('{"layers":[1,1]}', 400, "duplicate_layer"),
            ('{"layers":[-2]}', 422, "layer_out_of_range"),
            (Features(layers=(1,), logits="full").to_header(), 400, "feature_not_offered"),
            (Features(final_hidden=True).to_header(), 400, "feature_not_offered"),
            (Features(layers=(-1,)).to_header(), 400, "feature_not_offered"),
            ("{not json", 400, "bad_features"),
            ("[" * 3000, 400, "bad_features"),
            ('{"layers":' + "[" * 2000 + "]" * 2000 + "}", 400, "bad_features"),
            ('{"layers":[1],"colour":"red"}', 400, "bad_features"),
            ("{}", 400, "bad_features"),
            ('{"logits":"full","shift":"yes"}', 400, "bad_features"),
        ]
        for header, status, error in cases:
            got, body = await ask(srv, header, ids)
            assert (got, body["error"]) == (status, error), header
            assert body["detail"]
        got, body = await ask(srv, Features(layers=(1,)), ids, **{ENCODING_HEADER: "logits"})
        assert (got, body["error"]) == (400, "features_with_encoding")
        got, body = await ask(srv, Features(layers=(1,)), ids, **{NCCL_HEADER: "1"})
        assert (got, body["error"]) == (400, "features_over_p2p")
        assert (await ask(srv, Features(layers=(2, 1)), ids))[0] == 200
    async with serve(lambda: SyntheticRunner(**options), ServerOptionsCap(64)) as srv:
        got, body = await ask(srv, Features(layers=(1,)), torch.zeros(5, 13, dtype=torch.long))
        assert (got, body["error"]) == (413, "batch_too_large")


def ServerOptionsCap(tokens: int):
    from eagle3_target.server.options import ServerOptions

    return ServerOptions(max_batch_tokens=tokens)


async def test_model_info_lists_features_and_weights_serves_them(tiny):
    async with serve(lambda: HFRunner(tiny, name="tiny")) as srv:
        async with srv.http.post(f"{srv.url}/model_info") as resp:
            info = await resp.json()
        assert info["features"] == [
            "layers",
            "embedding_output",
            "final_hidden",
            "logits",
            "draft_probs",
            "packing",
        ]
        assert info["weights"] == ["input_embeddings", "lm_head", "final_norm"]
        want = {
            "input_embeddings": tiny.model.embed_tokens.weight,
            "lm_head": tiny.lm_head.weight,
            "final_norm": tiny.model.norm.weight,
        }
        for name, weight in want.items():
            async with srv.http.post(f"{srv.url}/weights/{name}") as resp:
                assert torch.equal(wire.decode(bytearray(await resp.read()))["weight"], weight)
        resp = await srv.post("weights/optimizer")
        assert resp.status == 400


def test_expected_shapes_match_the_reply():
    features = Features(layers=(1, 2), final_hidden=True, logits="full", shift=True)
    want = capture.expected(features, 2, 5, H, V, 0, torch.float32)
    assert {k: v[1] for k, v in want.items()} == {
        "hidden_states": (2, 5, 2 * H),
        "final_hidden": (2, 5, H),
        "logits": (2, 5, V),
    }
    assert tuple(want) == features.reply_keys
