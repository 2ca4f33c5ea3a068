"""ViSpec stage 2 (TrainVispecRecipe; HFVispecTargetModel): on image-text batches, the embedding output with the
image features merged in (the trainer shifts it left), the post-norm last hidden state unshifted,
full-vocabulary logits and the image mask shifted left. The trainer applies the target's lm_head every step.
The batch's images travel with the request (contract.IMAGE_KEYS)."""

from ..family_spec import Family
from ..features import EMBEDDING_OUTPUT, LOGITS_FULL, WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD, Features

FAMILY = Family(
    name="vispec",
    ask=lambda _layers, _n: Features(
        layers=(EMBEDDING_OUTPUT,), final_hidden=True, logits=LOGITS_FULL, shift=True, image_mask=True
    ),
    weights=(WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD),
    # the trainer applies the lm_head it holds to the post-norm hidden state, then shifts
    compact=lambda _layers, _n: Features(
        layers=(EMBEDDING_OUTPUT,), final_hidden=True, shift=True, image_mask=True
    ),
)
