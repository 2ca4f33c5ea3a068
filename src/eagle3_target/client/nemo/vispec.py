"""NeMo's ViSpec recipes (arXiv:2509.15235) with the fleet as their vision-language target.

Stage 1 (TrainVispecStage1Recipe) is EAGLE-1's training plus a ranking term, on text, against the target's
language model: the fleet sends EAGLE-1's features (eagle1.py's RemoteEagleTarget builds NeMo's batch from
them, ``remote_target.compact`` included). Stage 2 (TrainVispecRecipe) trains on image-text batches: each
request carries the batch's images, and the fleet sends the merged embedding output, the post-norm hidden
state, the logits and the image mask (protocol/families/vispec.py); RemoteVispecTarget builds NeMo's
VispecTargetBatch from them. NeMo's setup loads the target with transformers' AutoModelForImageTextToText and
checks that its input embedding looks trained; here it reads the config only and NeMo's check runs on the
embedding fetched from the fleet.
YAML: NeMo's own for the recipe, plus ``remote_target:`` (remote.py) with ``prefetch_depth`` and ``compact``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from eagle3_target.protocol.contract import IMAGE_KEYS
from eagle3_target.protocol.families import by_recipe

from ._imports import nemo_module
from .eagle1 import RemoteEagle1Recipe
from .features import FeatureTarget, open_backend, shift_left
from .prefetch import image_inputs
from .takeover import ConfigOnlyLoader

_vispec = nemo_module("recipes.llm.train_vispec")
_vispec_target = nemo_module("components.speculative.eagle.vispec_target")


class RemoteVispecTarget(FeatureTarget):
    """Duck-typed as NeMo's HFVispecTargetModel: ``generate_batch(input_ids, attention_mask, loss_mask,
    **vision_inputs)`` returns its VispecTargetBatch."""

    def __init__(self, backend, weights, device: torch.device, prefetch_depth=None, *, compact=False):
        super().__init__(backend, weights, device, prefetch_depth)
        self.compact = compact

    @torch.no_grad()
    def generate_batch(self, input_ids, attention_mask, loss_mask, **vision_inputs):
        unknown = sorted(k for k, v in vision_inputs.items() if v is not None and k not in IMAGE_KEYS)
        if unknown:
            raise ValueError(f"the fleet takes images ({', '.join(IMAGE_KEYS)}), not {', '.join(unknown)}")
        images = image_inputs(vision_inputs)
        captured = self.prefetched.take(input_ids, attention_mask, loss_mask, images=images)
        inputs = dict(attention_mask=attention_mask, loss_mask=loss_mask)
        return self.to_batch(self._on_device(captured), inputs)

    def to_batch(self, captured: dict[str, torch.Tensor], inputs: dict[str, Any]):
        hidden = captured["final_hidden"]
        logits = shift_left(self.get_lm_head()(hidden)) if self.compact else captured["logits"]
        return _vispec_target.VispecTargetBatch(
            inputs_embeds=shift_left(captured["hidden_states"]),
            input_hidden_states=hidden,
            target_logits=logits,
            attention_mask=inputs["attention_mask"],
            loss_mask=shift_left(inputs["loss_mask"]),
            image_mask=captured["image_mask"],
        )


class FetchedEmbeddings:
    """What NeMo's untrained-target check reads of a target: its input embedding, here the fleet's."""

    def __init__(self, target_wrapper):
        self._embedding = target_wrapper.get_input_embeddings()

    def named_parameters(self) -> Iterator:
        return iter(())  # nothing is on the meta device: the trainer holds no target parameters

    def get_input_embeddings(self):
        return self._embedding


@contextlib.contextmanager
def swapped(module, **replacements) -> Iterator[None]:
    """Within: ``module``'s names are ``replacements``; restored after."""
    saved = {name: getattr(module, name) for name in replacements}
    for name, value in replacements.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


class TrainVispecStage1Recipe(RemoteEagle1Recipe, _vispec.TrainVispecStage1Recipe):
    """NeMo's TrainVispecStage1Recipe, unchanged but for where the target runs: the eagle3-target fleet."""

    def setup(self):
        checked: list[str] = []  # the target paths NeMo's setup asked to check, checked after the fetch
        with swapped(
            _vispec,
            AutoModelForImageTextToText=ConfigOnlyLoader,
            HFEagleTargetModel=self._fleet_wrapper,
            raise_if_target_not_materialized=lambda _target, path: checked.append(path),
        ):
            super().setup()
        for path in checked:
            _vispec.raise_if_target_not_materialized(FetchedEmbeddings(self.target_wrapper), path)


class TrainVispecRecipe(RemoteEagle1Recipe, _vispec.TrainVispecRecipe):
    """NeMo's TrainVispecRecipe (ViSpec stage 2), unchanged but for where the target runs: the fleet."""

    def setup(self):
        checked: list[str] = []
        with swapped(
            _vispec,
            AutoModelForImageTextToText=ConfigOnlyLoader,
            HFVispecTargetModel=self._vispec_wrapper,
            raise_if_target_not_materialized=lambda _target, path: checked.append(path),
        ):
            super().setup()
        for path in checked:
            _vispec.raise_if_target_not_materialized(FetchedEmbeddings(self.target_wrapper), path)

    def _vispec_wrapper(self, _config_only_target, *, image_token_id: int) -> RemoteVispecTarget:
        family = by_recipe(type(self).__name__)
        backend, weights = open_backend(family, self.device, self.remote_target, compact=self.compact)
        return RemoteVispecTarget(backend, weights, self.device, self.prefetch_depth, compact=self.compact)
