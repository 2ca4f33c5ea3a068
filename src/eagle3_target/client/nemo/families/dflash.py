"""DFlash, Domino and DFlash 2 on the trainer, torch-free: its recipes and what the fleet replaces. Its adapter,
client/nemo/dflash.py, and NeMo's recipe are imported only when it trains."""

from __future__ import annotations

from ..family import FleetFamily

FAMILY = FleetFamily(
    name="dflash",
    recipes=("TrainDFlashRecipe", "TrainDominoRecipe", "TrainDFlash2Recipe"),
    replaces="HFDFlashTargetModel",
)
