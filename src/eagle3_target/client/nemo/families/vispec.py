"""ViSpec (stage 2) on the trainer, torch-free: its recipes and what the fleet replaces. Its adapter,
client/nemo/vispec.py, and NeMo's recipe are imported only when it trains."""

from __future__ import annotations

from ..family import FleetFamily

FAMILY = FleetFamily(
    name="vispec",
    recipes=("TrainVispecRecipe",),
    replaces="HFVispecTargetModel",
)
