"""NVIDIA NeMo AutoModel's draft trainers on the fleet: a NeMo target backend, and NeMo's recipes over it.

Needs nemo-automodel (the ``nemo`` extra); nothing else in eagle3_target imports this package. Every recipe
that protocol/families/ names is exported here under NeMo's own class name, from its family's adapter module.
"""

from __future__ import annotations

import importlib
import importlib.util

from eagle3_target.protocol.families import Family, recipe_families

from .backend import NeMoTargetBackend

# Recipe class name -> family, for the families whose adapter module is here.
RECIPES: dict[str, Family] = {
    recipe: fam
    for recipe, fam in recipe_families().items()
    if importlib.util.find_spec(f"{__name__}.{fam.adapter_module}") is not None
}

__all__ = ["NeMoTargetBackend", "RECIPES", "recipe_class", *sorted(RECIPES)]


def recipe_class(name: str) -> type:
    """Our remote subclass of NeMo's recipe ``name``; ValueError naming the ones there are."""
    if name not in RECIPES:
        raise ValueError(
            f"recipe: {name} is not a recipe the fleet trains; choose one of {', '.join(sorted(RECIPES))}"
        )
    return getattr(importlib.import_module(f"{__name__}.{RECIPES[name].adapter_module}"), name)


def __getattr__(name: str):
    # A recipe pulls in NeMo's whole training stack (torchao, torchdata, ...): import it only when asked.
    if name not in RECIPES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return recipe_class(name)
