"""EAGLE-3 supervision from one target forward: the math every runner, encoding and client shares.

Given unshifted full-vocab logits [B, S, V] and aux states [B, S, 3H], produce
SUPERVISION_KEYS in order. The shift by one is done on the small tensors only:
the [B, S, V] logits are never copied, only sliced.

The server (encoding "nemo") and the client (decoding "logits" or "hidden") build
the supervision with the same ``assemble``: the same ops on the same values in
the same dtype, so "logits" is bit-identical to "nemo" on the same device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VocabMapping:
    """The draft vocabulary: ids in the trainer's (unsorted) order and a mask over the target vocab."""

    selected_token_ids: torch.Tensor  # int64 [Vd]
    selected_token_mask: torch.Tensor  # bool [V]

    @classmethod
    def identity(cls, vocab_size: int, device: torch.device | str = "cpu") -> VocabMapping:
        return cls(
            torch.arange(vocab_size, device=device),
            torch.ones(vocab_size, dtype=torch.bool, device=device),
        )


def append_zero_position(tail: torch.Tensor) -> torch.Tensor:
    """[B, S-1, ...] -> [B, S, ...]: positions 1..S-1 moved to 0..S-2, the last one zero."""
    out = tail.new_zeros(tail.shape[0], tail.shape[1] + 1, *tail.shape[2:])
    out[:, :-1] = tail
    return out


def shift_left(x: torch.Tensor) -> torch.Tensor:
    """Shift along dim 1 by one and fill the last position with zeros."""
    return append_zero_position(x[:, 1:])


def draft_logits_tail(logits: torch.Tensor, vocab: VocabMapping) -> torch.Tensor:
    """The draft-vocabulary columns of positions 1..S-1, in the target's dtype: [B, S-1, Vd]."""
    return logits[:, 1:].index_select(-1, vocab.selected_token_ids)


def position_mask(logits: torch.Tensor, loss_mask: torch.Tensor, vocab: VocabMapping) -> torch.Tensor:
    """mask[argmax(shift(logits))] & shift(loss_mask), as [B, S, 1] bool."""
    batch, seq, _ = logits.shape
    out = torch.zeros(batch, seq, 1, dtype=torch.bool, device=logits.device)
    if seq > 1:
        # The zero-filled last position has argmax 0, and its shifted loss mask is 0: always False.
        top = logits[:, 1:].argmax(dim=-1)
        out[:, :-1, 0] = vocab.selected_token_mask[top] & loss_mask[:, 1:].bool()
    return out


@torch.no_grad()  # not inference_mode: the client assembles what a trainer's loss saves for backward
def assemble(
    aux_hidden_states: torch.Tensor,
    draft_tail: torch.Tensor,
    mask: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """The five supervision tensors in SUPERVISION_KEYS order from the draft logits of positions 1..S-1.

    target_probs = softmax(float32(shifted draft logits)), the last position uniform.
    """
    return {
        "aux_hidden_states": aux_hidden_states,
        "target_probs": torch.softmax(append_zero_position(draft_tail).float(), dim=-1),
        "position_mask": mask,
        "input_ids": shift_left(input_ids),
        "loss_mask": shift_left(loss_mask),
    }


@torch.inference_mode()
def build_supervision(
    logits: torch.Tensor,
    aux_hidden_states: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    vocab: VocabMapping,
) -> dict[str, torch.Tensor]:
    """Return the five supervision tensors in SUPERVISION_KEYS order (see spec.py), as NeMo computes them."""
    return assemble(
        aux_hidden_states,
        draft_logits_tail(logits, vocab),
        position_mask(logits, loss_mask, vocab),
        input_ids,
        loss_mask,
    )
