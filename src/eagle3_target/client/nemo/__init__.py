"""NVIDIA NeMo AutoModel's EAGLE-3 trainer on the fleet: a NeMo target backend and NeMo's recipe over it.

Needs nemo-automodel (the ``nemo`` extra); nothing else in eagle3_target imports this package.
"""

from __future__ import annotations

from .backend import NeMoTargetBackend

__all__ = ["NeMoTargetBackend", "TrainEagle3Recipe"]


def __getattr__(name: str):
    # The recipe pulls in NeMo's whole training stack (torchao, torchdata, ...): import it only when asked.
    if name == "TrainEagle3Recipe":
        from .recipe import TrainEagle3Recipe

        return TrainEagle3Recipe
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
