"""Draft families as data: what each asks of the target per batch, and which weights it fetches once.

One module per family, each defining ``FAMILY``; ``families()`` finds them all, so adding a family is
adding a module here (and its recipe adapter in client/nemo/), nothing else: ``eagle3_target.client.nemo``
exports every recipe named here from its adapter, and `eagle3-target train-draft` dispatches on the YAML's
``recipe:`` key through ``by_recipe``. Torch-free.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

from ..features import Features

# (target_layer_ids, num_hidden_layers) -> what one batch asks of the target
Ask = Callable[[Sequence[int], int], Features]

DEFAULT_RECIPE = "TrainEagle3Recipe"  # what a YAML without a recipe: key trains (NeMo's EAGLE-3 convention)


@dataclass(frozen=True)
class Family:
    name: str
    recipes: tuple[str, ...]  # the NeMo AutoModel 0.7.0 recipes (or draft types) it serves
    ask: Ask  # the exact request: the batch as NeMo's co-located target wrapper computes it
    weights: tuple[str, ...]  # fetched once at setup (features.py WEIGHT_NAMES)
    # The compact request where full-vocabulary logits dominate: the post-norm hidden state, the
    # trainer applying the lm_head (weights then include "lm_head"). None: the exact request is small.
    compact: Ask | None = None
    # The module under eagle3_target.client.nemo that defines a class named after each recipe; default: name.
    adapter: str | None = None

    @property
    def adapter_module(self) -> str:
        return self.adapter or self.name

    @property
    def recipe_classes(self) -> tuple[str, ...]:
        """The recipes that are classes (``TrainEagle3Recipe:parallel_drafting`` is a mode of one)."""
        return tuple(r for r in self.recipes if r.isidentifier())


@cache
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


def recipe_families() -> dict[str, Family]:
    """Recipe class name -> the family whose adapter defines it (the first family to name it)."""
    found: dict[str, Family] = {}
    for fam in sorted(families().values(), key=lambda f: f.name):
        for recipe in fam.recipe_classes:
            found.setdefault(recipe, fam)
    return found


def recipe_name(value: object) -> str:
    """A YAML ``recipe:`` value in any of NeMo's forms (bare class name, dotted path, {_target_: path})
    as the class name; absent: EAGLE-3."""
    if value is None:
        return DEFAULT_RECIPE
    if isinstance(value, dict) and isinstance(value.get("_target_"), str):
        value = value["_target_"]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"recipe: {value!r:.80} is not a recipe class name")
    return value.strip().rsplit(".", 1)[-1]


def by_recipe(recipe: str) -> Family:
    """The family of a recipe class name; ValueError naming the ones there are."""
    found = recipe_families()
    if recipe not in found:
        known = ", ".join(sorted(found))
        raise ValueError(f"recipe: {recipe} is not a recipe the fleet trains; choose one of {known}")
    return found[recipe]
