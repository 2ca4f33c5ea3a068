"""NVIDIA NeMo AutoModel's draft trainers on the fleet: a NeMo target backend, and NeMo's recipes over it.

Needs nemo-automodel (the ``nemo`` extra); nothing else in eagle3_target imports this package but
`train-draft` and `precompute`. Every recipe a family trains (registry.py) is exported under NeMo's own class
name, from its family's adapter, imported when first asked for (loading.py).
"""

from __future__ import annotations

from ._imports import require_nemo
from .loading import recipe_class
from .registry import recipes

require_nemo()  # without NeMo AutoModel, importing this package says what to install


def __getattr__(name: str):
    # A recipe pulls in NeMo's whole training stack (torchao, torchdata, ...), the backend NeMo's remote
    # client: import each only when asked, so the families' registry needs neither torch nor NeMo.
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
