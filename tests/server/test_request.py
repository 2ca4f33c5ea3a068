"""Request bodies turned into checked tensors (server/request.py): each refusal's class, error and words, at the
edges of what is allowed."""

import pytest
import torch
from target_support import generate_body, vocab_body

from eagle3_target.protocol import wire
from eagle3_target.server.errors import InvalidInput, OutOfRange, TooLarge
from eagle3_target.server.request import MAX_ENTRIES, packing_offered, parse_generate, parse_vocab_mapping

V = 10


def refused(parse, body: bytes, *args) -> tuple[type, str, str]:
    with pytest.raises((InvalidInput, OutOfRange, TooLarge)) as error:
        parse(bytearray(body), *args)
    return type(error.value), error.value.error, error.value.detail


def test_a_batch_at_every_limit_is_taken_whole():
    ids = torch.tensor([[0, V - 1, 3], [1, 2, 9]])
    mask, loss = torch.ones_like(ids), torch.tensor([[0, 1, 1], [1, 1, 0]])
    got = parse_generate(bytearray(generate_body(ids, mask, loss)), V, 6)  # exactly --max-batch-tokens
    assert list(got) == ["input_ids", "attention_mask", "loss_mask"]
    for name, value in zip(got, (ids, mask, loss), strict=True):
        assert torch.equal(got[name], value), name


@pytest.mark.parametrize(
    "tensors, expected",
    [
        (
            {
                "input_ids": torch.zeros(2, 4, dtype=torch.long),
                "attention_mask": torch.ones(2, 4, dtype=torch.long),
            },
            (
                InvalidInput,
                "missing_keys",
                "missing tensors ['loss_mask']; expected ['input_ids', 'attention_mask', 'loss_mask']",
            ),
        ),
        (
            {"input_ids": torch.zeros(2, 4, dtype=torch.int32), "attention_mask": None, "loss_mask": None},
            (InvalidInput, "missing_keys", "missing tensors ['attention_mask', 'loss_mask']; expected"),
        ),
    ],
)
def test_missing_tensors_are_named(tensors, expected):
    kind, error, detail = refused(parse_generate, wire.encode(tensors), V, 100)
    assert (kind, error) == expected[:2] and detail.startswith(expected[2]), detail


def generate(ids, mask=None, loss=None) -> bytes:
    return generate_body(ids, mask, loss)


ZEROS = torch.zeros(2, 3, dtype=torch.long)


@pytest.mark.parametrize(
    "body, max_tokens, expected",
    [
        (
            generate(ZEROS.int(), ZEROS, ZEROS),
            100,
            (InvalidInput, "wrong_dtype", "input_ids must be torch.int64, got torch.int32"),
        ),
        (
            generate(ZEROS, ZEROS, ZEROS.bool()),
            100,
            (InvalidInput, "wrong_dtype", "loss_mask must be torch.int64, got torch.bool"),
        ),
        (
            generate(torch.zeros(6, dtype=torch.long)),
            100,
            (InvalidInput, "bad_shape", "input_ids must be a non-empty [B, S] matrix, got [6]"),
        ),
        (
            generate(torch.zeros(2, 0, dtype=torch.long)),
            100,
            (InvalidInput, "bad_shape", "input_ids must be a non-empty [B, S] matrix, got [2, 0]"),
        ),
        (
            generate(torch.zeros(0, 3, dtype=torch.long)),
            100,
            (InvalidInput, "bad_shape", "input_ids must be a non-empty [B, S] matrix, got [0, 3]"),
        ),
        (
            generate(ZEROS, torch.zeros(2, 4, dtype=torch.long), ZEROS),
            100,
            (InvalidInput, "shape_mismatch", "attention_mask has shape [2, 4], input_ids has [2, 3]"),
        ),
        (
            generate(ZEROS, ZEROS, torch.zeros(3, 2, dtype=torch.long)),
            100,
            (InvalidInput, "shape_mismatch", "loss_mask has shape [3, 2], input_ids has [2, 3]"),
        ),
        (
            generate(ZEROS),
            5,
            (
                TooLarge,
                "batch_too_large",
                "batch x sequence is 2 x 3 = 6 tokens; this server takes at most 5 (--max-batch-tokens)",
            ),
        ),
        (
            generate(torch.tensor([[0, V]])),
            100,
            (OutOfRange, "token_out_of_range", f"input_ids span [0, {V}], vocab is [0, {V})"),
        ),
        (
            generate(torch.tensor([[-1, 3]])),
            100,
            (OutOfRange, "token_out_of_range", f"input_ids span [-1, 3], vocab is [0, {V})"),
        ),
        (b"TEM", 100, (InvalidInput, "bad_wire_blob", "truncated blob: magic needs 4 bytes")),
    ],
)
def test_a_bad_batch_is_refused_in_words(body, max_tokens, expected):
    kind, error, detail = refused(parse_generate, body, V, max_tokens)
    assert (kind, error) == expected[:2] and detail.startswith(expected[2]), detail


def test_a_blob_of_more_entries_than_a_request_has_is_refused():
    tensors = {f"k{i}": torch.zeros(1) for i in range(MAX_ENTRIES)}
    body = wire.encode({**tensors, "input_ids": ZEROS, "attention_mask": ZEROS, "loss_mask": ZEROS})
    assert refused(parse_generate, body, V, 100) == (
        InvalidInput,
        "bad_wire_blob",
        f"more than {MAX_ENTRIES} entries",
    )
    tensors = {f"k{i}": torch.zeros(1) for i in range(MAX_ENTRIES - 3)}  # exactly MAX_ENTRIES in all
    body = wire.encode({**tensors, "input_ids": ZEROS, "attention_mask": ZEROS, "loss_mask": ZEROS})
    assert set(parse_generate(bytearray(body), V, 100)) == {"input_ids", "attention_mask", "loss_mask"}


def test_a_vocab_mapping_is_copied_out_of_the_body():
    ids, mask = torch.tensor([9, 0, 4]), torch.zeros(V, dtype=torch.bool)
    mask[ids] = True
    body = bytearray(vocab_body(ids, mask))
    mapping = parse_vocab_mapping(body, V, "cpu")
    assert torch.equal(mapping.selected_token_ids, ids) and torch.equal(mapping.selected_token_mask, mask)
    body[:] = bytes(len(body))  # the body's memory is reused: the mapping keeps its own copy
    assert torch.equal(mapping.selected_token_ids, ids) and torch.equal(mapping.selected_token_mask, mask)


MASK = torch.ones(V, dtype=torch.bool)


@pytest.mark.parametrize(
    "ids, mask, expected",
    [
        (
            torch.tensor([1, 2], dtype=torch.int32),
            MASK,
            (InvalidInput, "wrong_dtype", "selected_token_ids must be torch.int64, got torch.int32"),
        ),
        (
            torch.tensor([1, 2]),
            MASK.long(),
            (InvalidInput, "wrong_dtype", "selected_token_mask must be torch.bool, got torch.int64"),
        ),
        (
            torch.zeros(0, dtype=torch.long),
            MASK,
            (InvalidInput, "bad_shape", "selected_token_ids must be a non-empty vector, got [0]"),
        ),
        (
            torch.zeros(2, 2, dtype=torch.long),
            MASK,
            (InvalidInput, "bad_shape", "selected_token_ids must be a non-empty vector, got [2, 2]"),
        ),
        (
            torch.tensor([1]),
            torch.ones(V - 1, dtype=torch.bool),
            (OutOfRange, "bad_mask_length", f"selected_token_mask must have shape [{V}], got [{V - 1}]"),
        ),
        (
            torch.tensor([1]),
            torch.ones(1, V, dtype=torch.bool),
            (OutOfRange, "bad_mask_length", f"selected_token_mask must have shape [{V}], got [1, {V}]"),
        ),
        (
            torch.tensor([0, V]),
            MASK,
            (OutOfRange, "token_out_of_range", f"selected_token_ids span [0, {V}], vocab is [0, {V})"),
        ),
        (
            torch.tensor([-1, V - 1]),
            MASK,
            (OutOfRange, "token_out_of_range", f"selected_token_ids span [-1, {V - 1}], vocab is [0, {V})"),
        ),
    ],
)
def test_a_bad_vocab_mapping_is_refused_in_words(ids, mask, expected):
    assert refused(parse_vocab_mapping, vocab_body(ids, mask), V, "cpu") == expected


def test_a_vocab_mapping_at_its_limits_is_taken():
    mapping = parse_vocab_mapping(bytearray(vocab_body(torch.tensor([V - 1, 0]), MASK)), V, "cpu")
    assert mapping.selected_token_ids.tolist() == [V - 1, 0] and mapping.selected_token_mask.all()
    missing = wire.encode({"selected_token_ids": torch.tensor([1])})
    assert refused(parse_vocab_mapping, missing, V, "cpu") == (
        InvalidInput,
        "missing_keys",
        "missing tensors ['selected_token_mask']; expected ['selected_token_ids', 'selected_token_mask']",
    )


def packed(seq_lens, positions=(0, 1, 2, 0), keys=("position_ids", "seq_lens")) -> bytes:
    """A [2, 4] batch with NeMo's packing metadata: seq_lens as given, every row's positions `positions`."""
    ids = torch.ones(2, 4, dtype=torch.long)
    meta = {"position_ids": torch.tensor([positions] * 2), "seq_lens": torch.as_tensor(seq_lens)}
    return wire.encode(
        {"input_ids": ids, "attention_mask": ids, "loss_mask": ids, **{k: meta[k] for k in keys}}
    )


def test_packed_rows_at_their_limits_are_taken():
    # as many documents as tokens, a zero length (NeMo's padding), positions 0 and S - 1
    for seq_lens, positions in (([[1, 1, 1, 1]] * 2, (0, 0, 0, 0)), ([[4, 0]] * 2, (0, 1, 2, 3))):
        got = parse_generate(bytearray(packed(seq_lens, positions)), V, 8)
        assert list(got)[-2:] == ["position_ids", "seq_lens"]
        assert torch.equal(got["seq_lens"], torch.tensor(seq_lens))
        assert torch.equal(got["position_ids"], torch.tensor([positions] * 2))


@pytest.mark.parametrize(
    "body, detail",
    [
        (
            packed([[3, 1]] * 2, keys=("seq_lens",)),
            "packed rows need both position_ids and seq_lens; got only seq_lens",
        ),
        (
            packed([[3, 1]] * 2, keys=("position_ids",)),
            "packed rows need both position_ids and seq_lens; got only position_ids",
        ),
        (packed([[3, 1]] * 2, positions=(0, 1, 2)), "position_ids has shape [2, 3], input_ids has [2, 4]"),
        (packed([3, 1]), "seq_lens must be [2, documents], got [2]"),
        (packed([[3, 1]]), "seq_lens must be [2, documents], got [1, 2]"),
        (packed(torch.zeros(2, 0, dtype=torch.long)), "seq_lens must be [2, documents], got [2, 0]"),
        (packed([[1, 1, 1, 1, 0]] * 2), "seq_lens has 5 documents per row, more than the 4 tokens"),
        (packed([[5, -1]] * 2), "seq_lens holds a negative length (-1)"),
        (packed([[3, 1], [3, 2]]), "seq_lens rows sum to [4, 5]; each must be the sequence length 4"),
        (packed([[3, 1], [2, 1]]), "seq_lens rows sum to [4, 3]; each must be the sequence length 4"),
        (
            packed([[3, 1]] * 2, positions=(0, 1, 2, 4)),
            "position_ids span [0, 4]; packed positions are in [0, 4)",
        ),
        (
            packed([[3, 1]] * 2, positions=(-1, 1, 2, 0)),
            "position_ids span [-1, 2]; packed positions are in [0, 4)",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else "packed",
)
def test_bad_packing_is_refused_in_words(body, detail):
    """Each refusal's words whole: the server answers with them."""
    assert refused(parse_generate, body, V, 8) == (InvalidInput, "bad_packing", detail)


def test_packed_rows_to_a_runner_without_packing_are_refused():
    rows = {"input_ids": torch.ones(1, 2, dtype=torch.long), "seq_lens": torch.tensor([[2]])}
    packing_offered(rows, True, "hf")  # offered: taken
    packing_offered({"input_ids": rows["input_ids"]}, False, "vllm")  # unpacked rows: taken anywhere
    with pytest.raises(InvalidInput) as error:
        packing_offered(rows, False, "vllm")
    assert (error.value.error, error.value.detail) == (
        "packing_not_offered",
        "this server's vllm runner cannot honour packed rows (a block-causal mask); "
        "send unpacked rows or use an hf server",
    )


def test_a_bad_sum_names_the_first_8_rows():
    ids = torch.ones(9, 2, dtype=torch.long)
    meta = {"position_ids": torch.zeros(9, 2, dtype=torch.long), "seq_lens": torch.arange(9).unsqueeze(1)}
    body = wire.encode({"input_ids": ids, "attention_mask": ids, "loss_mask": ids, **meta})
    detail = "seq_lens rows sum to [0, 1, 2, 3, 4, 5, 6, 7]; each must be the sequence length 2"
    assert refused(parse_generate, body, V, 18) == (InvalidInput, "bad_packing", detail)
