"""A feature reply's tensors: built by the server from one capture, checked by the client.

The server's part (``reply``) turns what a runner captured into the keys ``Features.reply_keys``
names; the client's part (``expected``) says which dtype and shape each must have, so a wrong
reply fails over like a dropped connection (encodings.check).
"""

from __future__ import annotations

import torch

from .encodings import Expected
from .features import (
    KEY_FINAL,
    KEY_HIDDEN,
    KEY_IMAGE_MASK,
    KEY_LOGITS,
    LOGITS_DRAFT_PROBS,
    LOGITS_FULL,
    Features,
)
from .supervision import VocabMapping, build_supervision, shift_left


def expected(
    features: Features,
    batch: int,
    seq: int,
    hidden_size: int,
    vocab_size: int,
    draft_vocab: int,
    dtype: torch.dtype | None,
) -> Expected:
    """Per reply key: its dtype (None: any) and shape. Logits keep the engine's own dtype."""
    want: Expected = {}
    if features.layers:
        want[KEY_HIDDEN] = (dtype, (batch, seq, len(features.layers) * hidden_size))
    if features.final_hidden:
        want[KEY_FINAL] = (dtype, (batch, seq, hidden_size))
    if features.logits == LOGITS_FULL:
        want[KEY_LOGITS] = (None, (batch, seq, vocab_size))
    elif features.logits == LOGITS_DRAFT_PROBS:
        want["target_probs"] = (torch.float32, (batch, seq, draft_vocab))
        want["position_mask"] = (torch.bool, (batch, seq, 1))
        want["input_ids"] = (torch.int64, (batch, seq))
        want["loss_mask"] = (torch.int64, (batch, seq))
    if features.image_mask:
        want[KEY_IMAGE_MASK] = (torch.bool, (batch, seq))
    return want


@torch.inference_mode()
def reply(
    features: Features,
    hidden_states: torch.Tensor | None,
    final_hidden: torch.Tensor | None,
    logits: torch.Tensor | None,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    vocab: VocabMapping | None,
) -> dict[str, torch.Tensor]:
    """The reply tensors in send order from one capture (``logits`` unshifted, full vocabulary), each capture
    that ``features.shift`` names shifted left (draft_probs are of the shifted logits already)."""
    out: dict[str, torch.Tensor] = {}
    if features.layers:
        out[KEY_HIDDEN] = hidden_states
    if features.final_hidden:
        out[KEY_FINAL] = final_hidden
    if features.logits == LOGITS_FULL:
        out[KEY_LOGITS] = logits
    shifted = {k: shift_left(out[k]) for k in features.shift if k in out}
    out.update(shifted)
    if features.logits == LOGITS_DRAFT_PROBS:
        # EAGLE-3's own math (what the "nemo" encoding sends), less the aux states sent above.
        supervision = build_supervision(logits, logits.new_empty(0), input_ids, loss_mask, vocab)
        del supervision["aux_hidden_states"]
        out.update(supervision)
    return out


def image_mask(input_ids: torch.Tensor, image_token_id: int, features: Features) -> torch.Tensor:
    """ViSpec's image mask [B, S] bool: where input_ids hold the image placeholder, shifted left if asked."""
    mask = input_ids == image_token_id
    return shift_left(mask) if KEY_IMAGE_MASK in features.shift else mask
