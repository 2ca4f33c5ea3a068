"""P-EAGLE on the trainer, torch-free: its recipes and what the fleet replaces. Its adapter,
client/nemo/peagle.py, and NeMo's recipe are imported only when it trains."""

from __future__ import annotations

from ..family import FleetFamily

FAMILY = FleetFamily(
    name="peagle",
    recipes=("TrainEagle3Recipe",),
    replaces="HFEagle3TargetModel",
    selected_by="parallel_drafting",
)
