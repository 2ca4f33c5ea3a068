"""P-EAGLE (TrainEagle3Recipe with parallel_drafting): three aux layers unshifted, full-vocabulary
target_logits shifted left with a zero last row (the trainer shifts input_ids and loss_mask itself)."""

from ..family_spec import Family
from ..features import LOGITS_FULL, WEIGHT_INPUT_EMBEDDINGS, Features

FAMILY = Family(
    name="peagle",
    ask=lambda layers, _n: Features(layers=tuple(layers), logits=LOGITS_FULL, shift=True),
    weights=(WEIGHT_INPUT_EMBEDDINGS,),
    compact=lambda layers, _n: Features(layers=tuple(layers), final_hidden=True),
)
