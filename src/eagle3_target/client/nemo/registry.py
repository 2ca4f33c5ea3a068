"""Every draft family the fleet trains, by its torch-free declaration: each protocol family
(protocol/families/) paired with the declaration of the same name in families/, and each entry point of
the ``eagle3_target.families`` group (a package outside the tree, as vLLM finds its plugins). Nothing here
imports an adapter or a NeMo recipe: loading.py does, for the one family that runs. Bench, precompute,
`train-draft`, the tests and the docs table all enumerate the families through this module.
"""

from __future__ import annotations

import importlib
from functools import cache
from importlib.metadata import entry_points

from eagle3_target.protocol.families import families as protocol_families

from .family import FleetFamily

DEFAULT_RECIPE = "TrainEagle3Recipe"  # what a YAML without a recipe: key trains (NeMo's EAGLE-3 convention)
ENTRY_POINTS = "eagle3_target.families"  # name = package.module:FAMILY, a FleetFamily of that name


@cache
def families() -> dict[str, FleetFamily]:
    """Every family, by name; a protocol family without its declaration here is an error."""
    found = {}
    for name in sorted(protocol_families()):
        try:
            module = importlib.import_module(f"{__package__}.families.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.families.{name}":
                raise
            raise ImportError(
                f"protocol/families/{name}.py has no trainer side: client/nemo/families/{name}.py"
            ) from None
        found[name] = named(module.FAMILY, name, f"client/nemo/families/{name}.py")
    for point in entry_points(group=ENTRY_POINTS):
        if point.name in found:
            raise ValueError(f"entry point {point.name} = {point.value} ({ENTRY_POINTS}): that family exists")
        found[point.name] = named(point.load(), point.name, f"entry point {point.name} = {point.value}")
    return dict(sorted(found.items()))


def named(declared: object, name: str, where: str) -> FleetFamily:
    if not isinstance(declared, FleetFamily) or declared.name != name:
        raise ValueError(f"{where} declares {declared!r:.80}, not the FleetFamily {name!r}")
    return declared


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


def unknown_recipe(name: str) -> ValueError:
    return ValueError(
        f"recipe: {name} is not a recipe the fleet trains; choose one of {', '.join(sorted(recipes()))}"
    )


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
        raise unknown_recipe(recipe)
    return own


def offline_caches() -> dict[str, FleetFamily]:
    """The families `eagle3-target precompute --family` writes a cache for."""
    return {n: f for n, f in families().items() if f.offline_cache is not None}
