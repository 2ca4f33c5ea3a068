"""Draft families as data: what each asks of the target per batch, and which weights it fetches once.

One module per family, each defining ``FAMILY``; ``families()`` finds them all, so adding a family is
adding a module here (and its recipe adapter in client/nemo/), nothing else. Torch-free.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..features import Features

# (target_layer_ids, num_hidden_layers) -> what one batch asks of the target
Ask = Callable[[Sequence[int], int], Features]


@dataclass(frozen=True)
class Family:
    name: str
    recipes: tuple[str, ...]  # the NeMo AutoModel 0.7.0 recipes (or draft types) it serves
    ask: Ask  # the exact request: the batch as NeMo's co-located target wrapper computes it
    weights: tuple[str, ...]  # fetched once at setup (features.py WEIGHT_NAMES)
    # The compact request where full-vocabulary logits dominate: the post-norm hidden state, the
    # trainer applying the lm_head (weights then include "lm_head"). None: the exact request is small.
    compact: Ask | None = None


def families() -> dict[str, Family]:
    """Every family module's FAMILY, by name."""
    found = {}
    for module in pkgutil.iter_modules(__path__):
        family = importlib.import_module(f"{__name__}.{module.name}").FAMILY
        found[family.name] = family
    return found


def family(name: str) -> Family:
    known = families()
    if name not in known:
        raise KeyError(f"unknown draft family {name!r}; known: {', '.join(sorted(known))}")
    return known[name]
