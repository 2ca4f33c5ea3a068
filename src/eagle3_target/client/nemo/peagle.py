"""P-EAGLE (NeMo's TrainEagle3Recipe with ``parallel_drafting: true``) on the fleet.

NeMo refuses a remote target here (``_validate_peagle_gates``): its remote protocol carries only
draft-vocabulary probabilities, and P-EAGLE's trainer consumes the target's full-vocabulary logits.
The fleet captures what NeMo's co-located HFEagle3TargetModel computes: the three aux layers
[B,S,3H] unshifted and the full logits, which are shifted left here with the input_ids and loss_mask.
With ``logits_on_trainer`` the fleet sends the post-norm hidden state instead and the trainer applies
the target's lm_head (fetched once): the same matmul on the same device, a V/H-fold smaller reply.
"""

from __future__ import annotations

from typing import Any

import torch

from ._imports import nemo_module
from .features import FeatureTarget, shift_left

Eagle3TargetBatch = nemo_module("components.speculative.eagle.target").Eagle3TargetBatch


class RemotePEagleTarget(FeatureTarget):
    """Duck-typed as NeMo's HFEagle3TargetModel: an Eagle3TargetBatch with full-vocabulary ``logits``."""

    def __init__(self, remote, device: torch.device, *, logits_on_trainer: bool = False):
        super().__init__(remote, device)
        self.logits_on_trainer = logits_on_trainer

    @staticmethod
    def request(*, aux_layer_ids: list[int], logits_on_trainer: bool = False) -> dict[str, Any]:
        if logits_on_trainer:
            return dict(layers=tuple(aux_layer_ids), final_hidden=True)
        return dict(layers=tuple(aux_layer_ids), logits="full")

    def to_batch(self, captured: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]):
        if self.logits_on_trainer:
            logits = self.get_lm_head()(captured["final_hidden"])
        else:
            logits = captured["logits"]
        return Eagle3TargetBatch(
            aux_hidden_states=captured["hidden_states"],
            logits=shift_left(logits),
            input_ids=shift_left(inputs["input_ids"]),
            attention_mask=inputs["attention_mask"],
            loss_mask=shift_left(inputs["loss_mask"]),
        )
