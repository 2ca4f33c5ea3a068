"""P-EAGLE: NeMo's TrainEagle3Recipe with ``parallel_drafting: true`` (the recipe is EAGLE-3's, so it is not
listed in FAMILIES; client/nemo/recipe.py switches to these when the YAML asks for parallel drafting).

Per batch: the three aux layers [B, S, 3H] unshifted and the full-vocabulary logits [B, S, V], which the
trainer shifts left (zero last row) with input_ids and loss_mask. Once: the input embeddings. With
remote_target.logits_on_trainer: the post-norm last hidden state [B, S, H] instead of the logits, and the
lm_head once, which the trainer applies (the last matmul of the target's forward).
"""

from __future__ import annotations

from ..features import LOGITS_FULL, WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD
from . import Family

LAYERS = "recipe_args.aux_layer_ids (default: NeMo's three, from the target's depth)"

PEAGLE = Family(
    "TrainEagle3Recipe",
    adapter="recipe",
    layers=LAYERS,
    logits=LOGITS_FULL,
    weights=(WEIGHT_INPUT_EMBEDDINGS,),
)
PEAGLE_LOGITS_ON_TRAINER = Family(
    "TrainEagle3Recipe",
    adapter="recipe",
    layers=LAYERS,
    final_hidden=True,
    weights=(WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD),
)

FAMILIES = ()
