"""Every draft family the fleet trains, found from the code: each protocol family (protocol/families/) paired
with the module of the same name here, which defines its ``FAMILY`` (family.py). Bench, precompute,
`train-draft`, the tests and the docs table all enumerate the families through this module.
"""

from __future__ import annotations

import importlib
from functools import cache

from eagle3_target.protocol.families import families as protocol_families

from .family import FleetFamily

DEFAULT_RECIPE = "TrainEagle3Recipe"  # what a YAML without a recipe: key trains (NeMo's EAGLE-3 convention)


@cache
def families() -> dict[str, FleetFamily]:
    """Every family, by name; a protocol family without its trainer module here is an error."""
    found = {}
    for name in sorted(protocol_families()):
        try:
            module = importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.{name}":
                raise
            raise ImportError(
                f"protocol/families/{name}.py has no trainer side: client/nemo/{name}.py"
            ) from None
        fleet_family = module.FAMILY
        if fleet_family.name != name:
            raise ValueError(f"client/nemo/{name}.py defines the family {fleet_family.name!r}")
        found[name] = fleet_family
    return found


def recipes() -> dict[str, FleetFamily]:
    """Recipe class name -> the family whose module defines the class."""
    return {r: f for f in families().values() if f.selected_by is None for r in f.recipes}


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


def recipe_class(name: str) -> type:
    """Our remote subclass of NeMo's recipe ``name``; ValueError naming the ones there are."""
    found = recipes()
    if name not in found:
        raise ValueError(
            f"recipe: {name} is not a recipe the fleet trains; choose one of {', '.join(sorted(found))}"
        )
    return getattr(importlib.import_module(f"{__package__}.{found[name].name}"), name)


def by_recipe(recipe: str, recipe_args=None) -> FleetFamily:
    """The family a recipe trains with these ``recipe_args``: one that a flag there selects, else the
    recipe's own."""
    own = None
    for fleet_family in families().values():
        if recipe not in fleet_family.recipes:
            continue
        if fleet_family.selected_by is None:
            own = fleet_family
        elif recipe_args is not None and bool(recipe_args.get(fleet_family.selected_by, False)):
            return fleet_family
    if own is None:
        recipe_class(recipe)  # raises, naming the recipes there are
    return own


def offline_caches() -> dict[str, FleetFamily]:
    """The families `eagle3-target precompute --family` writes a cache for."""
    return {n: f for n, f in families().items() if f.offline_cache is not None}
