"""NeMo's ViSpec stage 1 (TrainVispecStage1Recipe, arXiv:2509.15235) with the fleet as its vision-language target.

Stage 1 is EAGLE-1's training plus a ranking term, on text, against the target's language model: the fleet
sends EAGLE-1's features and eagle1.py's RemoteEagleTarget builds NeMo's batch from them
(``remote_target.compact`` included). NeMo's setup loads the target with transformers'
AutoModelForImageTextToText and checks that its input embedding looks trained: here it reads the config only
and NeMo's check runs on the embedding fetched from the fleet (vispec.py's ``vispec_takeover``).
YAML: NeMo's own for the recipe, plus ``remote_target:`` (remote.py).
"""

from __future__ import annotations

from ._imports import nemo_module
from .eagle1 import RemoteEagleTarget
from .vispec import VispecFleetRecipe

_vispec = nemo_module("recipes.llm.train_vispec")


class TrainVispecStage1Recipe(VispecFleetRecipe, _vispec.TrainVispecStage1Recipe):
    """NeMo's TrainVispecStage1Recipe, unchanged but for where the target runs: the eagle3-target fleet."""

    fleet_target = RemoteEagleTarget

    replaced_wrapper = "HFEagleTargetModel"
