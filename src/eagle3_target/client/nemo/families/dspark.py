"""DSpark on the trainer, torch-free: its recipes and what the fleet replaces. Its adapter,
client/nemo/dspark.py, and NeMo's recipe are imported only when it trains."""

from __future__ import annotations

from ..family import FleetFamily, OfflineCache

FAMILY = FleetFamily(
    name="dspark",
    recipes=("TrainDSparkRecipe",),
    replaces="HFDSparkTargetModel",
    offline_cache=OfflineCache(
        "eagle3_target.client.precompute.dspark:precompute_dspark",
        flags={"draft_num_hidden_layers": 5, "target_layer_ids": None, "chat_template": None}
        | {"target_attn_implementation": None, "target_force_hf": False},
    ),
)
