"""ViSpec stage 1 (TrainVispecStage1Recipe): EAGLE-1's training with a ranking term, on text only, against an
image-text target's language model. NeMo's co-located HFEagleTargetModel gives EAGLE-1's features: the
post-norm hidden state (the trainer also shifts it left) and full-vocabulary logits shifted left."""

from ..family_spec import Family
from ..features import LOGITS_FULL, WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD, Features

FAMILY = Family(
    name="vispec_stage1",
    ask=lambda _layers, _n: Features(final_hidden=True, logits=LOGITS_FULL, shift=True),
    weights=(WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD),
    compact=lambda _layers, _n: Features(final_hidden=True),
)
