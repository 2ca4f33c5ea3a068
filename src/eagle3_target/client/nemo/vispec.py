"""NeMo's ViSpec stage 2 (TrainVispecRecipe, arXiv:2509.15235) with the fleet as its vision-language target.

Stage 2 trains on image-text batches: each request carries its batch's images as the processor made them
(contract.IMAGE_KEYS; NeMo's pipeline casts pixel_values to bfloat16 and they travel so), and the fleet sends
the embedding output with the image features merged in, the post-norm hidden state, the logits and the image
mask (protocol/families/vispec.py); RemoteVispecTarget builds NeMo's VispecTargetBatch from them. With
``remote_target.compact: true`` the logits are the lm_head the trainer holds applied to the hidden state.

Both ViSpec recipes load their target with transformers' AutoModelForImageTextToText inside one setup() and
check that its input embedding looks trained (``raise_if_target_not_materialized``): within that setup the
loader reads the config only, the wrapper is the fleet's, and the check runs afterwards on the embedding the
fleet handed out.
YAML: NeMo's own for the recipe, plus ``remote_target:`` (remote.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from eagle3_target.protocol.contract import IMAGE_KEYS

from ._imports import nemo_module
from .captures import shift_left
from .fleet_recipe import FleetRecipe
from .fleet_target import FleetTarget
from .interface import BatchInputs
from .takeover import ConfigOnlyLoader

_vispec = nemo_module("recipes.llm.train_vispec")
_vispec_target = nemo_module("components.speculative.eagle.vispec_target")
BATCH_KEYS = ("input_ids", "attention_mask", "loss_mask", "position_ids", "seq_lens", "doc_remaining")


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


class VispecFleetRecipe(FleetRecipe):
    """Mixed in before a NeMo ViSpec recipe: its target loader, wrapper and untrained-target check taken over."""

    replaced_wrapper = "HFVispecTargetModel"

    def fleet_setup(self):
        self._checked: list[str] = []  # the target paths NeMo's setup asked to check, checked after the fetch
        return swapped(
            _vispec,
            AutoModelForImageTextToText=ConfigOnlyLoader,
            raise_if_target_not_materialized=lambda _target, path: self._checked.append(path),
            **{self.replaced_wrapper: lambda _config_only, **_kw: self.open_fleet_target()},
        )

    def setup(self):
        super().setup()
        for path in self._checked:
            _vispec.raise_if_target_not_materialized(FetchedEmbeddings(self.target_wrapper), path)


class RemoteVispecTarget(FleetTarget):
    """Duck-typed as NeMo's HFVispecTargetModel: ``generate_batch(input_ids, attention_mask, loss_mask,
    **vision_inputs)`` returns its VispecTargetBatch."""

    def to_batch(self, captured: dict[str, torch.Tensor], inputs: BatchInputs):
        media = sorted(k for k, v in inputs.media.items() if v is not None and k not in IMAGE_KEYS)
        if media:
            raise ValueError(f"the fleet takes images ({', '.join(IMAGE_KEYS)}), not {', '.join(media)}")
        return _vispec_target.VispecTargetBatch(
            inputs_embeds=shift_left(captured["hidden_states"]),
            input_hidden_states=captured["final_hidden"],
            target_logits=shift_left(self.logits(captured)) if self.compact else captured["logits"],
            attention_mask=inputs.attention_mask,
            loss_mask=shift_left(inputs.loss_mask),
            image_mask=captured["image_mask"],
        )


class TrainVispecRecipe(VispecFleetRecipe, _vispec.TrainVispecRecipe):
    """NeMo's TrainVispecRecipe (ViSpec stage 2), unchanged but for where the target runs: the fleet."""

    fleet_target = RemoteVispecTarget
