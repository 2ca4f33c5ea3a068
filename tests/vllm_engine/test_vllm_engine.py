"""The vllm engine against the hf engine on the same tiny Llama: the supervision a trainer gets must agree."""

import pytest
import torch

from eagle3_target.protocol.supervision import shift_left
from eagle3_target.server import errors
from eagle3_target.server.runners import load_runner
from eagle3_target.server.runners.base import Capture, ForwardInputs
from eagle3_target.server.runners.vllm import ONE_PER_PROCESS

from .vllm_support import AUX_LAYER_IDS, BATCHES, VOCAB, batch, supervision


@pytest.fixture(scope="module")
def engines(vllm_model_dir):
    options = dict(model=vllm_model_dir, dtype="float32", device="cpu", aux_layer_ids=AUX_LAYER_IDS)
    vllm_runner = load_runner("vllm", **options)
    hf_runner = load_runner("hf", **options)
    yield vllm_runner, hf_runner
    vllm_runner.close()
    hf_runner.close()


def assert_agree(got: dict, want: dict, attention_mask: torch.Tensor, atol: float) -> None:
    """Equal where the hf engine's numbers mean something: at real tokens (aux), and where the next
    token is real (target_probs; the hf engine computes padding too, vLLM leaves it zero)."""
    real = attention_mask.bool()
    next_real = shift_left(attention_mask).bool()
    for key, where in (("aux_hidden_states", real), ("target_probs", next_real)):
        assert got[key].shape == want[key].shape, key
        torch.testing.assert_close(got[key][where], want[key][where], atol=atol, rtol=0, msg=key)
    for key in ("position_mask", "input_ids", "loss_mask"):
        assert torch.equal(got[key], want[key]), key


@pytest.mark.parametrize("name", list(BATCHES))
def test_float32_supervision_matches_the_hf_engine(engines, name):
    (input_ids, attention_mask, loss_mask), vocab = BATCHES[name]
    vllm_runner, hf_runner = engines
    got = supervision(vllm_runner, input_ids, attention_mask, loss_mask, vocab)
    want = supervision(hf_runner, input_ids, attention_mask, loss_mask, vocab)
    assert_agree(got, want, attention_mask, atol=1e-4)
    padded = ~attention_mask.bool()
    assert not got["aux_hidden_states"][padded].any()


def test_a_second_epoch_and_shared_prefixes_give_the_same_answers(engines):
    """Batches that repeat a prefix (a second epoch, a shared system prompt) must not hit a prefix cache."""
    vllm_runner, hf_runner = engines
    # Long enough to fill whole KV blocks: a prefix cache would hit on them.
    input_ids, attention_mask, loss_mask = batch(3, 300, [300, 300, 200], seed=5)
    input_ids[1, :280] = input_ids[0, :280]  # rows sharing a prefix within one batch
    want = supervision(hf_runner, input_ids, attention_mask, loss_mask, None)
    for _epoch in range(2):
        got = supervision(vllm_runner, input_ids, attention_mask, loss_mask, None)
        assert_agree(got, want, attention_mask, atol=1e-4)
    longer = torch.cat([input_ids, torch.randint(0, VOCAB, (3, 8))], dim=1)
    longer_mask = torch.cat([attention_mask, attention_mask[:, -1:].expand(3, 8)], dim=1)
    longer_loss = torch.cat([loss_mask, loss_mask[:, -1:].expand(3, 8)], dim=1)
    assert_agree(
        supervision(vllm_runner, longer, longer_mask, longer_loss, None),
        supervision(hf_runner, longer, longer_mask, longer_loss, None),
        longer_mask,
        atol=1e-4,
    )


def test_identity_matches_the_hf_engine(engines):
    vllm_runner, hf_runner = engines
    expected = {**hf_runner.info.model_info().to_json(), "engine": "vllm"}
    expected["features"].remove("packing")  # vLLM takes no block-causal mask
    assert vllm_runner.info.model_info().to_json() == expected
    assert torch.equal(vllm_runner.input_embeddings(), hf_runner.input_embeddings())


def test_the_hidden_encoding_gets_the_final_states_and_head_rows_of_the_hf_engine(engines):
    vllm_runner, hf_runner = engines
    assert "hidden" in vllm_runner.info.encodings
    input_ids, attention_mask, _ = BATCHES["padding and loss masks"][0]
    real = attention_mask.bool()
    got = vllm_runner.forward_hidden(input_ids, attention_mask)
    want = hf_runner.forward_hidden(input_ids, attention_mask)
    for name, a, b in zip(("logits", "aux", "hidden"), got, want, strict=True):
        torch.testing.assert_close(a[real], b[real], atol=1e-4, rtol=0, msg=name)
    ids = torch.tensor([5, 0, 511, 42])
    assert torch.equal(vllm_runner.lm_head_rows(ids), hf_runner.lm_head_rows(ids))


def test_a_second_engine_in_the_process_is_refused_before_loading(engines, vllm_model_dir):
    """An in-process vLLM engine's shutdown destroys the process groups any other one there still uses."""
    with pytest.raises(ValueError) as err:
        load_runner("vllm", model=vllm_model_dir, dtype="bfloat16", device="cpu")
    assert str(err.value) == ONE_PER_PROCESS


def test_left_padded_rows_are_refused(engines):
    vllm_runner, _ = engines
    input_ids, attention_mask, _ = batch(2, 8, [8, 5], seed=6)
    with pytest.raises(errors.InvalidInput) as err:
        vllm_runner.forward(input_ids, attention_mask.flip(1))
    assert err.value.error == "unsupported_padding"


def test_a_batch_over_the_engine_limits_is_refused_before_any_work(engines):
    vllm_runner, _ = engines
    too_long = vllm_runner.max_model_len + 1
    with pytest.raises(errors.TooLarge) as err:
        vllm_runner.forward(torch.zeros(1, too_long, dtype=torch.long), torch.ones(1, too_long))
    assert "longest row" in err.value.detail
    rows = vllm_runner.max_batch_tokens // vllm_runner.max_model_len + 1
    shape = (rows, vllm_runner.max_model_len)
    with pytest.raises(errors.TooLarge) as err:
        vllm_runner.forward(torch.zeros(shape, dtype=torch.long), torch.ones(shape))
    assert "tokens in all" in err.value.detail


def test_out_of_vocabulary_ids_are_refused_before_vllm_and_the_runner_keeps_serving(engines):
    """vLLM does not check ids itself: its step fails inside the engine, which then hangs."""
    vllm_runner, hf_runner = engines
    input_ids, attention_mask, loss_mask = batch(2, 12, [12, 7], seed=7)
    bad = input_ids.clone()
    for wrong in (VOCAB, -1):
        bad[0, 3] = wrong
        with pytest.raises(errors.OutOfRange) as err:
            vllm_runner.forward(bad, attention_mask)
        assert err.value.error == "token_out_of_range"
    got = supervision(vllm_runner, input_ids, attention_mask, loss_mask, None)
    want = supervision(hf_runner, input_ids, attention_mask, loss_mask, None)
    assert_agree(got, want, attention_mask, atol=1e-4)


def test_an_all_padding_batch_gives_zeros(engines):
    vllm_runner, _ = engines
    logits, aux = vllm_runner.forward(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 5))
    assert logits.shape == (2, 5, VOCAB) and aux.shape == (2, 5, 3 * vllm_runner.info.hidden_size)
    assert not logits.any() and not aux.any()


def test_a_feature_capture_matches_the_hf_engine(engines):
    """Any layers (-1: the embeddings), the final normed states and the logits; the lm_head and final
    norm weights are the hf engine's."""
    vllm_runner, hf_runner = engines
    (input_ids, attention_mask, _), _ = BATCHES["padding and loss masks"]
    real = attention_mask.bool()
    inputs = ForwardInputs(input_ids, attention_mask)
    for want in (Capture(layers=(-1, 5, 0), final_hidden=True, logits=True), Capture(layers=(2,))):
        got, ref = vllm_runner.capture(inputs, want), hf_runner.capture(inputs, want)
        for name in ("hidden_states", "final_hidden", "logits"):
            a, b = getattr(got, name), getattr(ref, name)
            assert (a is None) == (b is None), name
            if a is not None:
                torch.testing.assert_close(a[real], b[real], atol=1e-4, rtol=0, msg=name)
                assert not a[~real].any(), name
    for name in ("input_embeddings", "lm_head", "final_norm"):
        assert torch.equal(vllm_runner.weight(name), hf_runner.weight(name)), name
