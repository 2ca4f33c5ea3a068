"""EAGLE-3 (NeMo's TrainEagle3Recipe): three aux layers, target_probs over the draft vocabulary, shifted.

The same tensors as the "nemo" encoding, whose path a stock client takes without any request.
"""

from ..features import LOGITS_DRAFT_PROBS, WEIGHT_INPUT_EMBEDDINGS, Features
from . import Family

FAMILY = Family(
    name="eagle3",
    ask=lambda layers, _n: Features(layers=tuple(layers), logits=LOGITS_DRAFT_PROBS, shift=True),
    weights=(WEIGHT_INPUT_EMBEDDINGS,),
)
