"""EAGLE-1 and EAGLE-2: NeMo's TrainEagle1Recipe and TrainEagle2Recipe (the same training; EAGLE-2 differs
in its tree policy at inference).

Per batch: the post-norm last hidden state [B, S, H] and the full-vocabulary logits [B, S, V], unshifted;
the trainer shifts both left (zero last row) with input_ids and loss_mask, keeping the hidden state
unshifted too. Once: the input embeddings, and the lm_head, which the trainer applies to the draft's output
every step. With remote_target.logits_on_trainer the fleet sends no logits and the trainer computes them
with that lm_head, the matmul the target's forward ends with.
"""

from __future__ import annotations

from ..features import LOGITS_FULL, WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD
from . import Family

LAYERS = "none: the post-norm last hidden state only"
WEIGHTS = (WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD)

FAMILIES = tuple(
    Family(recipe, adapter="eagle1", layers=LAYERS, final_hidden=True, logits=LOGITS_FULL, weights=WEIGHTS)
    for recipe in ("TrainEagle1Recipe", "TrainEagle2Recipe")
)
