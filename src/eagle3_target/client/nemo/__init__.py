"""NVIDIA NeMo AutoModel's draft trainers on the fleet: a NeMo target backend, and NeMo's recipes over it.

Needs nemo-automodel (the ``nemo`` extra); nothing else in eagle3_target imports this package. Every recipe
that protocol/families/ describes is exported here under NeMo's own class name, from its adapter module.
"""

from __future__ import annotations

import importlib

from eagle3_target.protocol.families import families

from .backend import NeMoTargetBackend

__all__ = ["NeMoTargetBackend", *sorted(families())]


def __getattr__(name: str):
    # A recipe pulls in NeMo's whole training stack (torchao, torchdata, ...): import it only when asked.
    found = families().get(name)
    if found is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{found.adapter}"), name)
