"""EAGLE-3 on the trainer, torch-free: its recipes and what the fleet replaces. Its adapter,
client/nemo/eagle3.py, and NeMo's recipe are imported only when it trains."""

from __future__ import annotations

from eagle3_target.protocol.choices import AUTO

from ..family import FleetFamily, OfflineCache

FAMILY = FleetFamily(
    name="eagle3",
    recipes=("TrainEagle3Recipe",),
    replaces="RemoteEagle3TargetModel",
    offline_cache=OfflineCache(
        "eagle3_target.client.precompute.eagle3:precompute_eagle3",
        flags={"draft_vocab_size": None, "target_probs_topk": 0, "aux_layer_ids": None, "encoding": AUTO}
        | {"allow_approximate": False},
    ),
)
