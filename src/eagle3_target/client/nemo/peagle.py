"""P-EAGLE (NeMo's TrainEagle3Recipe with ``parallel_drafting: true``) on the fleet.

NeMo refuses a remote target here (``_validate_peagle_gates``): its remote protocol carries only
draft-vocabulary probabilities, and P-EAGLE's trainer consumes the target's full-vocabulary logits.
The fleet captures what NeMo's co-located HFEagle3TargetModel computes (protocol/families/peagle.py): the
three aux layers [B,S,3H] unshifted and the full logits shifted left; input_ids and loss_mask are shifted
here. With ``remote_target.compact`` the fleet sends the post-norm hidden state [B,S,H] instead of the
logits and the trainer applies the target's lm_head (fetched once), the matmul the target's forward ends
with: a reply V/H times smaller per token, bit-identical on the CPU. TrainEagle3Recipe (eagle3.py) opens it
in the hook where NeMo loads its co-located target.
"""

from __future__ import annotations

import torch

from ._imports import nemo_module
from .captures import shift_left
from .fleet_target import FleetTarget
from .interface import BatchInputs

_target = nemo_module("components.speculative.eagle.target")


class RemotePEagleTarget(FleetTarget):
    """Duck-typed as NeMo's HFEagle3TargetModel: an Eagle3TargetBatch with full-vocabulary ``logits``."""

    def to_batch(self, captured: dict[str, torch.Tensor], inputs: BatchInputs):
        # the fleet shifts the logits it sends; the compact request's are computed here, then shifted
        logits = shift_left(self.logits(captured)) if self.compact else captured["logits"]
        return _target.Eagle3TargetBatch(
            aux_hidden_states=captured["hidden_states"],
            logits=logits,
            input_ids=shift_left(inputs.input_ids),
            attention_mask=inputs.attention_mask,
            loss_mask=shift_left(inputs.loss_mask),
        )
