"""NeMo's EAGLE-1 / EAGLE-2 recipes (TrainEagle1Recipe, TrainEagle2Recipe) with the fleet as their target.

NeMo's co-located HFEagleTargetModel gives the trainer the post-norm hidden state [B,S,H] and it shifted
left, the full-vocabulary logits shifted left, and the shifted input_ids / loss_mask; the trainer applies
the target's lm_head to the draft's output every step. The fleet sends the post-norm hidden state and
the full logits (or, with ``remote_target.logits_on_trainer: true``, only the hidden state: the trainer
holds the lm_head anyway and computes the logits with the same matmul); the lm_head and the embeddings
are fetched once.
"""

from __future__ import annotations

from typing import Any

import torch

from ._imports import nemo_module
from .features import FeatureTarget, PrefetchingLoader, open_backend, shift_left
from .remote_section import RemoteSection
from .takeover import fleet_target

_nemo_eagle1 = nemo_module("recipes.llm.train_eagle1")
_nemo_eagle2 = nemo_module("recipes.llm.train_eagle2")
EagleTargetBatch = nemo_module("components.speculative.eagle.target_v12").EagleTargetBatch


class RemoteEagleTarget(FeatureTarget):
    """Duck-typed as NeMo's HFEagleTargetModel."""

    def __init__(self, remote, device: torch.device, *, logits_on_trainer: bool = False):
        super().__init__(remote, device)
        self.logits_on_trainer = logits_on_trainer

    @staticmethod
    def request(*, logits_on_trainer: bool = False) -> dict[str, Any]:
        return dict(final_hidden=True, logits="none" if logits_on_trainer else "full")

    def to_batch(self, captured: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]):
        hidden = captured["final_hidden"]
        logits = self.get_lm_head()(hidden) if self.logits_on_trainer else captured["logits"]
        return EagleTargetBatch(
            input_hidden_states=hidden,
            target_hidden_states=shift_left(hidden),
            target_logits=shift_left(logits),
            input_ids=shift_left(inputs["input_ids"]),
            attention_mask=inputs["attention_mask"],
            loss_mask=shift_left(inputs["loss_mask"]),
            position_ids=inputs.get("position_ids"),
            seq_lens=inputs.get("seq_lens"),
            doc_remaining=inputs.get("doc_remaining"),
        )


class TrainEagle1Recipe(_nemo_eagle1.TrainEagle1Recipe):
    """NeMo's EAGLE-1 recipe, unchanged but for where the target runs: the eagle3-target fleet.

    ``remote_target:`` as for TrainEagle3Recipe, plus ``logits_on_trainer`` and ``prefetch_depth``
    (batches captured ahead of the training step; default: one per healthy server).
    """

    def __init__(self, cfg):
        self.remote = RemoteSection.from_config(cfg, family_options=("logits_on_trainer", "prefetch_depth"))
        super().__init__(cfg)

    def setup(self):
        self.remote.seed_torch()
        with fleet_target(_nemo_eagle1, "HFEagleTargetModel", self._fleet_wrapper):
            super().setup()
        self.train_dataloader = PrefetchingLoader(
            self.train_dataloader, self.target_wrapper, self.remote.prefetch_depth(self.target_wrapper)
        )

    def _fleet_wrapper(self, _config_only_target) -> RemoteEagleTarget:
        logits_on_trainer = bool(self.remote.family.get("logits_on_trainer", False))
        remote = open_backend(
            RemoteEagleTarget.request(logits_on_trainer=logits_on_trainer), self.device, self.remote.backend
        )
        target = RemoteEagleTarget(remote, self.device, logits_on_trainer=logits_on_trainer)
        target.wait_for_servers(self.remote.wait_timeout)
        return target


class TrainEagle2Recipe(TrainEagle1Recipe, _nemo_eagle2.TrainEagle2Recipe):
    """NeMo's EAGLE-2 recipe (EAGLE-1's training, another tree policy at inference) on the fleet."""
