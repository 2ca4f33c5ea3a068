"""NeMo's EAGLE-1 / EAGLE-2 recipes (TrainEagle1Recipe, TrainEagle2Recipe) with the fleet as their target.

NeMo's co-located HFEagleTargetModel gives the trainer the post-norm hidden state [B,S,H] and it shifted
left, the full-vocabulary logits shifted left, and the shifted input_ids / loss_mask; the trainer applies
the target's lm_head to the draft's output every step. The fleet sends the post-norm hidden state and
the full logits (with ``remote_target.compact: true`` only the hidden state: the trainer holds
the lm_head anyway and computes the logits with the same matmul); lm_head and embeddings come once.
YAML: NeMo's own for the recipe, plus ``remote_target:`` (remote.py) with ``prefetch_depth`` and
``compact``.
"""

from __future__ import annotations

from typing import Any

import torch

from eagle3_target.protocol.families import by_recipe

from ._imports import nemo_module
from .features import FeatureTarget, open_backend, shift_left
from .prefetch import depth_setting
from .remote import RemoteTargetSection
from .takeover import fleet_target

_eagle1 = nemo_module("recipes.llm.train_eagle1")
_eagle2 = nemo_module("recipes.llm.train_eagle2")
_target = nemo_module("components.speculative.eagle.target_v12")


class RemoteEagleTarget(FeatureTarget):
    """Duck-typed as NeMo's HFEagleTargetModel."""

    def __init__(self, backend, weights, device: torch.device, prefetch_depth=None, *, compact=False):
        super().__init__(backend, weights, device, prefetch_depth)
        self.compact = compact

    def to_batch(self, captured: dict[str, torch.Tensor], inputs: dict[str, Any]):
        hidden = captured["final_hidden"]
        # The fleet shifts the logits it sends; the compact request's are computed here, then shifted.
        logits = shift_left(self.get_lm_head()(hidden)) if self.compact else captured["logits"]
        return _target.EagleTargetBatch(
            input_hidden_states=hidden,
            target_hidden_states=shift_left(hidden),
            target_logits=logits,
            input_ids=shift_left(inputs["input_ids"]),
            attention_mask=inputs["attention_mask"],
            loss_mask=shift_left(inputs["loss_mask"]),
            position_ids=inputs.get("position_ids"),
            seq_lens=inputs.get("seq_lens"),
            doc_remaining=inputs.get("doc_remaining"),
        )


class RemoteEagle1Recipe(RemoteTargetSection):
    """Mixed in before NeMo's EAGLE-1 or EAGLE-2 recipe: the target is the fleet."""

    recipe_keys = ("prefetch_depth", "compact")

    def __init__(self, cfg):
        if int(cfg.get("distributed.tp_size", 1) or 1) > 1:
            raise ValueError("distributed.tp_size>1 shards a co-located target; the fleet runs it whole")
        super().__init__(cfg)
        self.prefetch_depth = depth_setting(self.recipe_settings.get("prefetch_depth"))
        self.compact = self.recipe_settings.get("compact", False)
        if not isinstance(self.compact, bool):
            raise ValueError(f"remote_target.compact={self.compact!r}: true or false")

    def setup(self):
        with fleet_target(_eagle1, "HFEagleTargetModel", self._fleet_wrapper):
            super().setup()
        self.target_wrapper.prefetched.wrap_loaders(self)

    def _fleet_wrapper(self, _config_only_target) -> RemoteEagleTarget:
        family = by_recipe(type(self).__name__)
        backend, weights = open_backend(family, self.device, self.remote_target, compact=self.compact)
        return RemoteEagleTarget(backend, weights, self.device, self.prefetch_depth, compact=self.compact)

    def run_train_validation_loop(self):
        try:
            super().run_train_validation_loop()
        finally:
            self.target_wrapper.close()  # ends our sessions on the servers


class TrainEagle1Recipe(RemoteEagle1Recipe, _eagle1.TrainEagle1Recipe):
    """NeMo's TrainEagle1Recipe, unchanged but for where the target runs: the eagle3-target fleet."""


class TrainEagle2Recipe(RemoteEagle1Recipe, _eagle2.TrainEagle2Recipe):
    """NeMo's TrainEagle2Recipe (EAGLE-1's training, EAGLE-2's tree at inference) on the fleet."""
