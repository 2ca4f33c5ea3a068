"""ViSpec's stage 1 on the trainer, torch-free: its recipes and what the fleet replaces. Its adapter,
client/nemo/vispec_stage1.py, and NeMo's recipe are imported only when it trains."""

from __future__ import annotations

from ..family import FleetFamily

FAMILY = FleetFamily(
    name="vispec_stage1",
    recipes=("TrainVispecStage1Recipe",),
    replaces="HFEagleTargetModel",
)
