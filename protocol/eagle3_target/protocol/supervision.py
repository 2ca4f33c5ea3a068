"""EAGLE-3 supervision from one target forward: the contract every runner shares.

Given unshifted full-vocab logits [B, S, V] and aux states [B, S, 3H], produce
SUPERVISION_KEYS in order. The shift by one is done on the small tensors only:
the [B, S, V] logits are never copied, only sliced.
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


def shift_left(x: torch.Tensor) -> torch.Tensor:
    """Shift along dim 1 by one and fill the last position with zeros."""
    out = torch.zeros_like(x)
    out[:, :-1] = x[:, 1:]
    return out


@torch.inference_mode()
def build_supervision(
    logits: torch.Tensor,
    aux_hidden_states: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    vocab: VocabMapping,
) -> dict[str, torch.Tensor]:
    """Return the five supervision tensors in SUPERVISION_KEYS order (see spec.py).

    target_probs = softmax(float32(shift(logits)[..., ids])) and
    position_mask = mask[argmax(shift(logits))] & shift(loss_mask), as NeMo computes them.
    """
    batch, seq, _ = logits.shape
    ids = vocab.selected_token_ids
    # Gather the draft columns, then shift: equal to shift-then-gather, but touches only [B, S, Vd].
    selected = shift_left(logits.index_select(-1, ids))
    target_probs = torch.softmax(selected.float(), dim=-1)

    shifted_loss_mask = shift_left(loss_mask)
    position_mask = torch.zeros(batch, seq, 1, dtype=torch.bool, device=logits.device)
    if seq > 1:
        # The zero-filled last position has argmax 0, and its shifted loss mask is 0: always False.
        top = logits[:, 1:].argmax(dim=-1)
        position_mask[:, :-1, 0] = vocab.selected_token_mask[top] & shifted_loss_mask[:, :-1].bool()

    return {
        "aux_hidden_states": aux_hidden_states,
        "target_probs": target_probs,
        "position_mask": position_mask,
        "input_ids": shift_left(input_ids),
        "loss_mask": shifted_loss_mask,
    }
