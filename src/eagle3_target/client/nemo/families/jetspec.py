"""JetSpec on the trainer, torch-free: its recipes and what the fleet replaces. Its adapter,
client/nemo/jetspec.py, and NeMo's recipe are imported only when it trains."""

from __future__ import annotations

from ..family import FleetFamily

FAMILY = FleetFamily(
    name="jetspec",
    recipes=("TrainJetSpecRecipe",),
    replaces="HFDFlashTargetModel",
)
