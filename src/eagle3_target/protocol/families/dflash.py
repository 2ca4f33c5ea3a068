"""DFlash, Domino, DFlash 2 (HFDFlashTargetModel): decoder-layer outputs at the recipe's target_layer_ids,
concatenated [B, S, n*H], before the final norm, unshifted. The draft reads the target's input embeddings
and lm_head live every step: fetched once.
"""

from __future__ import annotations

from ..family_spec import Family
from ..features import WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD, Features

FAMILY = Family(
    name="dflash",
    ask=lambda layers, _n: Features(layers=tuple(layers)),
    weights=(WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD),
)
