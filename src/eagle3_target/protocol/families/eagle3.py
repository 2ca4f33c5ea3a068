"""EAGLE-3: NeMo's own remote protocol, byte for byte (docs/nemo.md). Three aux layers chosen by the target
(model_info's aux_layer_ids), target_probs over the draft vocabulary, shifted; the input embeddings once."""

from __future__ import annotations

from ..features import LOGITS_DRAFT_PROBS, WEIGHT_INPUT_EMBEDDINGS
from . import Family

FAMILIES = (
    Family(
        "TrainEagle3Recipe",
        adapter="recipe",
        layers="the target's aux_layer_ids (three, /model_info)",
        logits=LOGITS_DRAFT_PROBS,
        shift=True,
        weights=(WEIGHT_INPUT_EMBEDDINGS,),
    ),
)
