import pytest
import torch
from target_support import spec_reference

from eagle3_target.protocol.contract import SUPERVISION_KEYS
from eagle3_target.protocol.model_info import default_aux_layer_ids, validate_aux_layer_ids
from eagle3_target.protocol.supervision import VocabMapping, build_supervision, shift_left


def test_default_recipe():
    assert default_aux_layer_ids(32) == [1, 15, 28]
    assert default_aux_layer_ids(8) == [1, 3, 4]


@pytest.mark.parametrize(
    "ids, message",
    [([1, 1, 2], "distinct"), ([1, 2], "three"), ([0, 5, 8], "out of range"), ([-1, 2, 3], "out of range")],
)
def test_aux_layer_validation(ids, message):
    with pytest.raises(ValueError, match=message):
        validate_aux_layer_ids(ids, 8)


def test_shift_left_zero_fills():
    x = torch.tensor([[1, 2, 3], [4, 5, 6]])
    assert shift_left(x).tolist() == [[2, 3, 0], [5, 6, 0]]


@pytest.mark.parametrize("S", [17, 2, 1])  # down to one position, whose shifted row is all zeros
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_literal_spec_bit_for_bit(dtype, S):
    g = torch.Generator().manual_seed(0)
    B, V, H = 3, 50, 4
    logits = torch.randn(B, S, V, generator=g).to(dtype)
    aux = torch.randn(B, S, 3 * H, generator=g).to(dtype)
    input_ids = torch.randint(0, V, (B, S), generator=g)
    loss_mask = torch.randint(0, 2, (B, S), generator=g)
    ids = torch.randperm(V, generator=g)[:20]  # unsorted draft vocab
    mask = torch.zeros(V, dtype=torch.bool)
    mask[ids] = True
    out = build_supervision(logits, aux, input_ids, loss_mask, VocabMapping(ids, mask))
    ref = spec_reference(logits, aux, input_ids, loss_mask, ids, mask)
    assert tuple(out) == SUPERVISION_KEYS
    for key in SUPERVISION_KEYS:
        assert out[key].dtype == ref[key].dtype and out[key].shape == ref[key].shape, key
        assert torch.equal(out[key], ref[key]), key
    assert out["target_probs"].dtype == torch.float32
    assert out["position_mask"].shape == (B, S, 1)


def test_columns_follow_the_given_unsorted_order_and_last_position_is_uniform():
    logits = torch.zeros(1, 3, 4)
    logits[0, 1, 3] = 10.0  # position 0 (after shift) strongly predicts token 3
    ids = torch.tensor([3, 0])  # column 0 is token 3
    mask = torch.tensor([True, False, False, True])
    out = build_supervision(
        logits,
        torch.zeros(1, 3, 3),
        torch.tensor([[5, 6, 7]]),
        torch.ones(1, 3, dtype=torch.long),
        VocabMapping(ids, mask),
    )
    probs = out["target_probs"][0]
    assert probs[0, 0] > 0.99 and probs[0, 1] < 0.01
    assert torch.equal(probs[-1], torch.full((2,), 0.5))
    assert out["position_mask"][0, :, 0].tolist() == [True, True, False]
    assert out["input_ids"].tolist() == [[6, 7, 0]]


def test_position_mask_is_false_where_argmax_is_outside_the_draft_vocab():
    logits = torch.zeros(1, 2, 3)
    logits[0, 1, 2] = 5.0  # argmax = token 2, not in the draft vocab
    out = build_supervision(
        logits,
        torch.zeros(1, 2, 3),
        torch.zeros(1, 2, dtype=torch.long),
        torch.ones(1, 2, dtype=torch.long),
        VocabMapping(torch.tensor([0, 1]), torch.tensor([True, True, False])),
    )
    assert out["position_mask"][0, :, 0].tolist() == [False, False]


def test_identity_mapping_gives_full_vocab_probs():
    logits = torch.randn(2, 5, 7)
    out = build_supervision(
        logits,
        torch.zeros(2, 5, 3),
        torch.zeros(2, 5, dtype=torch.long),
        torch.ones(2, 5, dtype=torch.long),
        VocabMapping.identity(7),
    )
    assert out["target_probs"].shape == (2, 5, 7)
    assert torch.allclose(out["target_probs"].sum(-1), torch.ones(2, 5))
