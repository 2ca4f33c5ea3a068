"""EAGLE-1 and EAGLE-2 on the trainer, torch-free: its recipes and what the fleet replaces. Its adapter,
client/nemo/eagle1.py, and NeMo's recipe are imported only when it trains."""

from __future__ import annotations

from ..family import FleetFamily

FAMILY = FleetFamily(
    name="eagle1",
    recipes=("TrainEagle1Recipe", "TrainEagle2Recipe"),
    replaces="HFEagleTargetModel",
)
