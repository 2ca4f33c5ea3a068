"""EAGLE-1/2 (TrainEagle1Recipe and TrainEagle2Recipe, the same training; HFEagleTargetModel): the post-norm hidden state (the trainer also shifts
it left) and full-vocabulary logits shifted left. The trainer applies the target's lm_head every step."""

from ..family_spec import Family
from ..features import LOGITS_FULL, WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD, Features

FAMILY = Family(
    name="eagle1",
    ask=lambda _layers, _n: Features(final_hidden=True, logits=LOGITS_FULL, shift=True),
    weights=(WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD),
    compact=lambda _layers, _n: Features(final_hidden=True),
)
