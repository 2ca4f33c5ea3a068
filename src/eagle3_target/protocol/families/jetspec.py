"""JetSpec (HFDFlashTargetModel with capture_logits): DFlash's layers plus full-vocabulary logits, unshifted."""

from ..family_spec import Family
from ..features import LOGITS_FULL, WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD, Features

FAMILY = Family(
    name="jetspec",
    ask=lambda layers, _n: Features(layers=tuple(layers), logits=LOGITS_FULL),
    weights=(WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD),
    compact=lambda layers, _n: Features(layers=tuple(layers), final_hidden=True),
)
