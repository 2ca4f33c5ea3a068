"""The supervision encodings as pure functions: exactness, sizes, checks, negotiation."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from eagle3_target.protocol import encodings, wire
from eagle3_target.protocol.contract import SUPERVISION_KEYS
from eagle3_target.protocol.encodings import HIDDEN, LOGITS, NEMO
from eagle3_target.protocol.model_info import ModelInfo
from eagle3_target.protocol.supervision import VocabMapping, build_supervision

B, S, V, H, VD = 3, 17, 60, 8, 24


def forward(dtype, seed=0):
    """A target forward whose logits are exactly lm_head(hidden), and an unsorted draft vocabulary."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, S, H, generator=g).to(dtype)
    head = torch.randn(V, H, generator=g).to(dtype)
    aux = torch.randn(B, S, 3 * H, generator=g).to(dtype)
    input_ids = torch.randint(0, V, (B, S), generator=g)
    loss_mask = torch.randint(0, 2, (B, S), generator=g)
    ids = torch.randperm(V, generator=g)[:VD]
    mask = torch.zeros(V, dtype=torch.bool)
    mask[ids] = True
    return F.linear(hidden, head), aux, hidden, head, input_ids, loss_mask, VocabMapping(ids, mask)


def round_trip(encoding, dtype, seed=0):
    """Server encode -> wire bytes -> client check and decode; and the "nemo" supervision to compare with."""
    logits, aux, hidden, head, input_ids, loss_mask, vocab = forward(dtype, seed)
    sent = encodings.encode(encoding, logits, aux, input_ids, loss_mask, vocab, hidden)
    received = wire.decode(bytearray(wire.encode(sent)))
    encodings.check(received, encodings.expected(encoding, B, S, H, VD, dtype))
    rows = head.index_select(0, vocab.selected_token_ids)
    got = encodings.decode(encoding, received, input_ids, loss_mask, rows)
    return got, build_supervision(logits, aux, input_ids, loss_mask, vocab)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("encoding", [NEMO, LOGITS])
def test_exact_encodings_decode_bit_identical_to_nemo(encoding, dtype):
    for seed in range(3):
        got, want = round_trip(encoding, dtype, seed)
        assert tuple(got) == SUPERVISION_KEYS
        for key in SUPERVISION_KEYS:
            assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), key


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-3)])
def test_hidden_is_within_its_tolerance_and_exact_elsewhere(dtype, tolerance):
    got, want = round_trip(HIDDEN, dtype)
    assert got["target_probs"].dtype == torch.float32
    assert (got["target_probs"] - want["target_probs"]).abs().max() <= tolerance
    for key in ("aux_hidden_states", "position_mask", "input_ids", "loss_mask"):
        assert torch.equal(got[key], want[key]), key


@pytest.mark.parametrize("count", [1, 7, 8, 9, 64, 1001])
def test_bits_round_trip_in_little_endian_order(count):
    mask = torch.rand(count, generator=torch.Generator().manual_seed(count)) > 0.5
    bits = encodings.pack_bits(mask)
    assert bits.dtype == torch.uint8 and bits.numel() == math.ceil(count / 8)
    assert torch.equal(encodings.unpack_bits(bits, count), mask)
    one = torch.zeros(count, dtype=torch.bool)
    one[count - 1] = True
    assert encodings.pack_bits(one)[-1].item() == 1 << ((count - 1) % 8)


class _Float32Sizes(TorchDispatchMode):
    """Records the element count of every float32 tensor an op produces."""

    def __init__(self):
        super().__init__()
        self.sizes = [0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.sizes.append(t.numel())
        return out


@pytest.mark.parametrize("encoding, builds_probs", [(NEMO, True), (LOGITS, False), (HIDDEN, False)])
def test_compact_encodings_build_no_float32_probabilities(encoding, builds_probs):
    logits, aux, hidden, _, input_ids, loss_mask, _ = forward(torch.bfloat16)
    vocab = VocabMapping.identity(V)  # the full vocabulary: the worst case, B*S*V floats
    with _Float32Sizes() as seen:
        encodings.encode(encoding, logits, aux, input_ids, loss_mask, vocab, hidden)
    assert (max(seen.sizes) >= B * S * V) == builds_probs


def per_token(encoding, seq=2048, hidden=4096, draft=32000):
    want = encodings.expected(encoding, 1, seq, hidden, draft, torch.bfloat16)
    itemsize = {torch.bfloat16: 2, torch.float32: 4, torch.int64: 8, torch.uint8: 1, torch.bool: 1}
    return sum(math.prod(shape) * itemsize[dtype] for dtype, shape in want.values()) / seq


def test_bytes_per_token_at_the_llama_8b_shape():
    assert 152_500 < per_token(NEMO) < 152_700  # NeMo's 152.6 KB
    assert per_token(LOGITS) <= 89_000
    assert per_token(HIDDEN) <= 33_000


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda t: t.pop("draft_logits"), "lacks 'draft_logits'"),
        (lambda t: t.update(draft_logits=t["draft_logits"][:, :-1]), "expected"),
        (lambda t: t.update(draft_logits=t["draft_logits"].float()), "expected torch.bfloat16"),
        (lambda t: t.update(position_bits=t["position_bits"][:-1]), "position_bits"),
        (lambda t: t.update(aux_hidden_states=None), "lacks 'aux_hidden_states'"),
    ],
)
def test_an_incomplete_or_misshapen_reply_is_a_wire_error(mutate, message):
    logits, aux, hidden, _, input_ids, loss_mask, vocab = forward(torch.bfloat16)
    sent = dict(encodings.encode(LOGITS, logits, aux, input_ids, loss_mask, vocab))
    mutate(sent)
    with pytest.raises(wire.WireError, match=message):
        encodings.check(sent, encodings.expected(LOGITS, B, S, H, VD, torch.bfloat16))


def test_negotiation():
    stock = ModelInfo(num_hidden_layers=4, hidden_size=8, vocab_size=16, aux_layer_ids=(1, 1, 0))
    assert encodings.offered(stock) == [NEMO]  # a server from before encodings
    newer = dataclasses.replace(stock, encodings=("nemo", "zstd", "logits"))
    assert encodings.offered(newer) == [NEMO, LOGITS]
    assert encodings.choose("auto", [NEMO, LOGITS, HIDDEN]) == LOGITS  # never the approximate one
    assert encodings.choose("auto", [NEMO]) == NEMO
    assert encodings.choose(HIDDEN, [NEMO, LOGITS, HIDDEN]) == HIDDEN
    with pytest.raises(
        encodings.EncodingError, match="http://a:1 does not offer encoding 'hidden'.*post-processes"
    ):
        encodings.choose(HIDDEN, [NEMO, LOGITS], "http://a:1")
    with pytest.raises(encodings.EncodingError, match=r"\(it offers nemo\)$"):
        encodings.choose(LOGITS, [NEMO])
    with pytest.raises(encodings.EncodingError, match="unknown encoding 'gzip'"):
        encodings.choose("gzip", [NEMO])


def test_refusals_say_what_was_asked_and_what_is_offered():
    def refusal(*args) -> str:
        with pytest.raises(encodings.EncodingError) as error:
            encodings.choose(*args)
        return str(error.value)

    assert refusal("gzip", [NEMO]) == "unknown encoding 'gzip'; choose auto, nemo, logits, hidden"
    assert (
        refusal(LOGITS, [NEMO, HIDDEN], "s") == "s does not offer encoding 'logits' (it offers nemo, hidden)"
    )
    assert refusal(HIDDEN, [NEMO]) == "the server does not offer encoding 'hidden' (it offers nemo)"
    assert refusal(HIDDEN, [NEMO, LOGITS], "s") == (
        "s does not offer encoding 'hidden' (it offers nemo, logits); its target post-processes logits, "
        "so only exact encodings are offered"
    )


def test_a_reply_check_names_what_it_found():
    with pytest.raises(wire.WireError) as error:
        encodings.check({"a": None, "b": torch.zeros(1), "c": torch.zeros(1)}, {"a": (None, (1,))})
    assert str(error.value) == "reply lacks 'a' (has ['b', 'c'])"
    with pytest.raises(wire.WireError) as error:
        encodings.check({"a": torch.zeros(2)}, {"a": (None, (3,))})
    assert str(error.value) == "reply 'a' is torch.float32 [2], expected any [3]"
