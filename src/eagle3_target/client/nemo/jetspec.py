"""NeMo's TrainJetSpecRecipe with the fleet as its target: DFlash's adapter (dflash.py), the fleet also
sending the full-vocabulary logits, unshifted, which JetSpec distills against (with
``remote_target.compact: true`` the post-norm hidden state instead, the lm_head applied on the trainer)."""

from __future__ import annotations

from ._imports import nemo_module
from .dflash import RemoteDFlashRecipe

_jetspec = nemo_module("recipes.llm.train_jetspec")


class TrainJetSpecRecipe(RemoteDFlashRecipe, _jetspec.TrainJetSpecRecipe):
    """NeMo's TrainJetSpecRecipe on the fleet, which sends the full-vocabulary logits too."""
