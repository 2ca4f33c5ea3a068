"""Turning untrusted request bodies into validated tensors; every failure is a ServiceError."""

from __future__ import annotations

import torch

from eagle3_target.protocol import wire
from eagle3_target.protocol.contract import GENERATE_INPUT_KEYS, IMAGE_KEYS, PACKING_KEYS, VOCAB_KEYS
from eagle3_target.protocol.supervision import VocabMapping

from .errors import InvalidInput, OutOfRange, TooLarge

# A request blob has two or three entries; more than this is not a client we speak to, and a
# 60 MiB blob of millions of tiny entries would otherwise cost millions of tensor objects.
MAX_ENTRIES = 16


def _decode(
    body: bytearray, keys: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict[str, torch.Tensor]:
    try:
        tensors = wire.decode(body, MAX_ENTRIES)
    except wire.WireError as exc:
        raise InvalidInput("bad_wire_blob", str(exc)) from None
    missing = [k for k in keys if tensors.get(k) is None]
    if missing:
        raise InvalidInput("missing_keys", f"missing tensors {missing}; expected {list(keys)}")
    return {k: tensors[k] for k in (*keys, *optional) if tensors.get(k) is not None}


def _expect_dtype(name: str, tensor: torch.Tensor, dtype: torch.dtype) -> None:
    if tensor.dtype != dtype:
        raise InvalidInput("wrong_dtype", f"{name} must be {dtype}, got {tensor.dtype}")


def parse_generate(body: bytearray, vocab_size: int, max_tokens: int) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask, loss_mask: int64 [B, S], same shape, B x S <= max_tokens, ids in [0, vocab);
    and, for packed rows, position_ids and seq_lens (check_packing)."""
    tensors = _decode(body, GENERATE_INPUT_KEYS, PACKING_KEYS + IMAGE_KEYS)
    for name, tensor in tensors.items():
        if name not in IMAGE_KEYS:  # images.py checks those against the target's image processor
            _expect_dtype(name, tensor, torch.int64)
    shape = tensors["input_ids"].shape
    if len(shape) != 2 or 0 in shape:
        raise InvalidInput("bad_shape", f"input_ids must be a non-empty [B, S] matrix, got {list(shape)}")
    for name in ("attention_mask", "loss_mask"):
        if tensors[name].shape != shape:
            raise InvalidInput(
                "shape_mismatch",
                f"{name} has shape {list(tensors[name].shape)}, input_ids has {list(shape)}",
            )
    if shape.numel() > max_tokens:
        raise TooLarge(
            "batch_too_large",
            f"batch x sequence is {shape[0]} x {shape[1]} = {shape.numel()} tokens; "
            f"this server takes at most {max_tokens} (--max-batch-tokens)",
        )
    ids = tensors["input_ids"]
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        raise OutOfRange("token_out_of_range", f"input_ids span [{low}, {high}], vocab is [0, {vocab_size})")
    if any(k in tensors for k in PACKING_KEYS):
        check_packing(tensors.get("position_ids"), tensors.get("seq_lens"), shape)
    return tensors


def packing_offered(inputs: dict[str, torch.Tensor], offered: bool, engine: str) -> None:
    if "seq_lens" in inputs and not offered:
        raise InvalidInput(
            "packing_not_offered",
            f"this server's {engine} runner cannot honour packed rows (a block-causal mask); "
            "send unpacked rows or use an hf server",
        )


def check_packing(
    position_ids: torch.Tensor | None, seq_lens: torch.Tensor | None, shape: torch.Size
) -> None:
    """NeMo's packing metadata for [B, S] rows: position_ids [B, S] in [0, S); seq_lens [B, D], D <= S,
    lengths >= 0, each row summing to S (NeMo folds a row's padding into its last document)."""
    if position_ids is None or seq_lens is None:
        given = "position_ids" if seq_lens is None else "seq_lens"
        raise InvalidInput(
            "bad_packing", f"packed rows need both {' and '.join(PACKING_KEYS)}; got only {given}"
        )
    batch, seq = shape
    if position_ids.shape != shape:
        raise InvalidInput(
            "bad_packing", f"position_ids has shape {list(position_ids.shape)}, input_ids has {list(shape)}"
        )
    if seq_lens.dim() != 2 or seq_lens.shape[0] != batch or seq_lens.shape[1] == 0:
        raise InvalidInput(
            "bad_packing", f"seq_lens must be [{batch}, documents], got {list(seq_lens.shape)}"
        )
    if seq_lens.shape[1] > seq:
        raise InvalidInput(
            "bad_packing", f"seq_lens has {seq_lens.shape[1]} documents per row, more than the {seq} tokens"
        )
    if int(seq_lens.min()) < 0:
        raise InvalidInput("bad_packing", f"seq_lens holds a negative length ({int(seq_lens.min())})")
    sums = seq_lens.sum(dim=1)
    if bool((sums != seq).any()):
        raise InvalidInput(
            "bad_packing", f"seq_lens rows sum to {sums.tolist()[:8]}; each must be the sequence length {seq}"
        )
    low, high = int(position_ids.min()), int(position_ids.max())
    if low < 0 or high >= seq:
        raise InvalidInput(
            "bad_packing", f"position_ids span [{low}, {high}]; packed positions are in [0, {seq})"
        )


def parse_vocab_mapping(body: bytearray, vocab_size: int, device: str) -> VocabMapping:
    """selected_token_ids int64 [Vd] in [0, V) and selected_token_mask bool [V]."""
    tensors = _decode(body, VOCAB_KEYS)
    ids, mask = tensors["selected_token_ids"], tensors["selected_token_mask"]
    _expect_dtype("selected_token_ids", ids, torch.int64)
    _expect_dtype("selected_token_mask", mask, torch.bool)
    if ids.dim() != 1 or ids.numel() == 0:
        raise InvalidInput(
            "bad_shape", f"selected_token_ids must be a non-empty vector, got {list(ids.shape)}"
        )
    if mask.dim() != 1 or mask.numel() != vocab_size:
        raise OutOfRange(
            "bad_mask_length",
            f"selected_token_mask must have shape [{vocab_size}], got {list(mask.shape)}",
        )
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        raise OutOfRange(
            "token_out_of_range", f"selected_token_ids span [{low}, {high}], vocab is [0, {vocab_size})"
        )
    # Copies, never views: a view would pin the whole request body for the session's life.
    return VocabMapping(ids.to(device, copy=True), mask.to(device, copy=True))
