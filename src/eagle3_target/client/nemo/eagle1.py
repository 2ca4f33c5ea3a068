"""NeMo's EAGLE-1 / EAGLE-2 recipes (TrainEagle1Recipe, TrainEagle2Recipe) with the fleet as their target.

NeMo's co-located HFEagleTargetModel gives the trainer the post-norm hidden state [B,S,H] and it shifted
left, the full-vocabulary logits shifted left, and the shifted input_ids / loss_mask; the trainer applies
the target's lm_head to the draft's output every step. The fleet sends the post-norm hidden state and
the full logits (with ``remote_target.compact: true`` only the hidden state: the trainer holds
the lm_head anyway and computes the logits with the same matmul); lm_head and embeddings come once.
NeMo loads and wraps the target inside one setup(), so the fleet stands in there (takeover.py).
YAML: NeMo's own for the recipe, plus ``remote_target:`` (remote.py).
"""

from __future__ import annotations

import torch

from ._imports import nemo_module
from .captures import shift_left
from .fleet_recipe import FleetRecipe
from .fleet_target import FleetTarget
from .interface import BatchInputs
from .takeover import fleet_target

_eagle1 = nemo_module("recipes.llm.train_eagle1")
_eagle2 = nemo_module("recipes.llm.train_eagle2")
_target = nemo_module("components.speculative.eagle.target_v12")


class RemoteEagleTarget(FleetTarget):
    """Duck-typed as NeMo's HFEagleTargetModel."""

    def to_batch(self, captured: dict[str, torch.Tensor], inputs: BatchInputs):
        hidden = captured["final_hidden"]
        # the fleet shifts the logits it sends; the compact request's are computed here, then shifted
        logits = shift_left(self.logits(captured)) if self.compact else captured["logits"]
        return _target.EagleTargetBatch(
            input_hidden_states=hidden,
            target_hidden_states=shift_left(hidden),
            target_logits=logits,
            input_ids=shift_left(inputs.input_ids),
            attention_mask=inputs.attention_mask,
            loss_mask=shift_left(inputs.loss_mask),
            position_ids=inputs.position_ids,
            seq_lens=inputs.seq_lens,
            doc_remaining=inputs.doc_remaining,
        )


class RemoteEagle1Recipe(FleetRecipe):
    """Mixed in before NeMo's EAGLE-1 or EAGLE-2 recipe: the target is the fleet."""

    fleet_target = RemoteEagleTarget

    def fleet_setup(self):
        return fleet_target(_eagle1, "HFEagleTargetModel", lambda _config_only: self.open_fleet_target())


class TrainEagle1Recipe(RemoteEagle1Recipe, _eagle1.TrainEagle1Recipe):
    """NeMo's TrainEagle1Recipe, unchanged but for where the target runs: the eagle3-target fleet."""


class TrainEagle2Recipe(RemoteEagle1Recipe, _eagle2.TrainEagle2Recipe):
    """NeMo's TrainEagle2Recipe (EAGLE-1's training, EAGLE-2's tree at inference) on the fleet."""
