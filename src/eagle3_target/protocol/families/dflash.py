"""DFlash, Domino, DFlash 2 (HFDFlashTargetModel): decoder-layer outputs at target_layer_ids, unshifted.

The draft reads the target's input embeddings and lm_head live every step: fetched once.
"""

from ..features import WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD, Features
from . import Family

FAMILY = Family(
    name="dflash",
    recipes=("TrainDFlashRecipe", "domino", "dflash2"),
    ask=lambda layers, _n: Features(layers=tuple(layers)),
    weights=(WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD),
)
