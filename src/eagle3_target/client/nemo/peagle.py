"""P-EAGLE (NeMo's TrainEagle3Recipe with ``parallel_drafting: true``) on the fleet.

NeMo refuses a remote target here (``_validate_peagle_gates``): its remote protocol carries only
draft-vocabulary probabilities, and P-EAGLE's trainer consumes the target's full-vocabulary logits.
The fleet captures what NeMo's co-located HFEagle3TargetModel computes (protocol/families/peagle.py): the
three aux layers [B,S,3H] unshifted and the full logits shifted left; input_ids and loss_mask are shifted
here. With ``remote_target.compact`` the fleet sends the post-norm hidden state [B,S,H] instead of the
logits and the trainer applies the target's lm_head (fetched once), the matmul the target's forward ends
with: a reply V/H times smaller per token, bit-identical on the CPU.
"""

from __future__ import annotations

from typing import Any

import torch

from eagle3_target.protocol.families import family

from ._imports import nemo_module
from .features import FeatureTarget, open_backend, shift_left

_target = nemo_module("components.speculative.eagle.target")


class RemotePEagleTarget(FeatureTarget):
    """Duck-typed as NeMo's HFEagle3TargetModel: an Eagle3TargetBatch with full-vocabulary ``logits``."""

    def __init__(self, backend, weights, device: torch.device, *, compact: bool = False):
        super().__init__(backend, weights, device)
        self.compact = compact

    def to_batch(self, captured: dict[str, torch.Tensor], inputs: dict[str, Any]):
        if self.compact:
            logits = shift_left(self.get_lm_head()(captured["final_hidden"]))
        else:
            logits = captured["logits"]  # shifted by the fleet
        return _target.Eagle3TargetBatch(
            aux_hidden_states=captured["hidden_states"],
            logits=logits,
            input_ids=shift_left(inputs["input_ids"]),
            attention_mask=inputs["attention_mask"],
            loss_mask=shift_left(inputs["loss_mask"]),
        )


def open_peagle_target(remote_target, device: torch.device, aux_layer_ids, num_layers: int, compact: bool):
    """The target wrapper for the aux layers NeMo's co-located target would capture."""
    if aux_layer_ids is None:
        aux_layer_ids = _target.default_eagle3_aux_layer_ids(num_layers)
    layers = _target.validate_eagle3_aux_layer_ids(aux_layer_ids, num_layers)
    backend, weights = open_backend(family("peagle"), device, remote_target, layers, num_layers, compact)
    return RemotePEagleTarget(backend, weights, device, compact=compact)
