"""Draft families: what each of NeMo's draft recipes asks of the target, one module per family here.

A family module defines ``FAMILIES``, a tuple of `Family`; the client's recipe adapter for it lives in
``eagle3_target.client.nemo.<adapter>`` and defines a class named after NeMo's recipe. Nothing else
lists them: `eagle3-target train-draft` and ``eagle3_target.client.nemo`` find them here.
Torch-free, like the rest of protocol/.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from functools import cache

from ..features import LOGITS_NONE, Features

DEFAULT_RECIPE = "TrainEagle3Recipe"  # what a YAML without a recipe: key trains (NeMo's EAGLE-3 convention)


@dataclass(frozen=True)
class Family:
    """One NeMo recipe's needs of the target.

    recipe: NeMo's recipe class name; our remote subclass has the same name.
    adapter: the module under eagle3_target.client.nemo that defines that subclass.
    layers: where the captured layer ids come from (the recipe decides them in setup()).
    logits, final_hidden, shift: as in Features, per batch.
    weights: what the trainer fetches once and uses live every step (protocol.features WEIGHT_*).
    exact: False where the fleet cannot reproduce the co-located recipe bit for bit (docs/families.md).
    """

    recipe: str
    adapter: str
    layers: str
    logits: str = LOGITS_NONE
    final_hidden: bool = False
    shift: bool = False
    weights: tuple[str, ...] = ()
    exact: bool = True

    def features(self, layers: tuple[int, ...] | list[int]) -> Features:
        """The per-batch request, once the recipe has chosen its layers."""
        return Features(
            layers=tuple(layers), final_hidden=self.final_hidden, logits=self.logits, shift=self.shift
        )


@cache
def families() -> dict[str, Family]:
    """Every family module's families, by recipe name."""
    found: dict[str, Family] = {}
    for module in pkgutil.iter_modules(__path__):
        for family in importlib.import_module(f"{__name__}.{module.name}").FAMILIES:
            if family.recipe in found:
                raise RuntimeError(f"two family modules describe {family.recipe}")
            found[family.recipe] = family
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


def family(recipe: str) -> Family:
    """The family of a recipe class name; ValueError naming the ones there are."""
    try:
        return families()[recipe]
    except KeyError:
        known = ", ".join(sorted(families()))
        raise ValueError(
            f"recipe: {recipe} is not a recipe the fleet trains; choose one of {known}"
        ) from None
