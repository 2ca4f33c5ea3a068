"""The DFlash family: NeMo's DFlash, Domino and DFlash 2 recipes, and JetSpec.

Per batch: the decoder-layer outputs at the recipe's target_layer_ids, concatenated [B, S, n*H], before the
final norm and unshifted (input_ids and loss_mask stay on the trainer). JetSpec distills against the
target's full-vocabulary logits [B, S, V], unshifted, too. Once: the input embeddings and the lm_head, which
the draft's trainer uses live every step.
"""

from __future__ import annotations

from ..features import LOGITS_FULL, WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD
from . import Family

LAYERS = "recipe_args.target_layer_ids (default: spread over the target by draft_num_hidden_layers)"
WEIGHTS = (WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD)

FAMILIES = (
    Family("TrainDFlashRecipe", adapter="dflash", layers=LAYERS, weights=WEIGHTS),
    Family("TrainJetSpecRecipe", adapter="dflash", layers=LAYERS, logits=LOGITS_FULL, weights=WEIGHTS),
    Family("TrainDominoRecipe", adapter="dflash", layers=LAYERS, weights=WEIGHTS),
    Family("TrainDFlash2Recipe", adapter="dflash", layers=LAYERS, weights=WEIGHTS),
)
