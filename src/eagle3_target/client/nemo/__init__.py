"""NVIDIA NeMo AutoModel's draft trainers on the fleet: a NeMo target backend, and NeMo's recipes over it.

Needs nemo-automodel (the ``nemo`` extra); nothing else in eagle3_target imports this package but
`train-draft` and `precompute`. Every recipe a family here trains (registry.py) is exported under NeMo's own
class name, from its family's module, when first asked for.
"""

from __future__ import annotations

from ._imports import nemo_module
from .registry import recipe_class, recipes

nemo_module("shared.import_utils")  # without NeMo AutoModel, importing this package says what to install


def __getattr__(name: str):
    # A recipe pulls in NeMo's whole training stack (torchao, torchdata, ...), the backend NeMo's draft models:
    # import them only when asked (a regen or decode_eval worker, fleet_cycles.py, needs neither).
    if name == "NeMoTargetBackend":
        from .backend import NeMoTargetBackend

        return NeMoTargetBackend
    if name == "RECIPES":
        return recipes()
    if name == "__all__":
        return ["NeMoTargetBackend", "RECIPES", "recipe_class", *sorted(recipes())]
    if name not in recipes():
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return recipe_class(name)
