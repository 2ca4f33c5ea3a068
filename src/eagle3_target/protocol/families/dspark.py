"""DSpark: NeMo's TrainDSparkRecipe.

Per batch: the recipe's target_layer_ids concatenated [B, S, n*H] (-1 the embedding output, the last layer
id the post-norm hidden state, any other id that decoder layer's output) and the post-norm last hidden
state [B, S, H], all unshifted. The fleet captures the post-norm state once (final_hidden) and the trainer
puts it in the last layer's place. Once: the input embeddings and the lm_head, which the draft copies at
setup.
"""

from __future__ import annotations

from ..features import WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD
from . import Family

FAMILIES = (
    Family(
        "TrainDSparkRecipe",
        adapter="dspark",
        layers="recipe_args.target_layer_ids (default: spread over the target by draft_num_hidden_layers)",
        final_hidden=True,
        weights=(WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD),
    ),
)
