"""Draft families as a server sees them: what each asks of the target per batch, and which weights it
fetches once.

One module per family, each defining ``FAMILY``; ``families()`` finds them all. The trainer's side of a
family (the NeMo recipes it trains, its batch conversion) is the module of the same name in
client/nemo/, which ``eagle3_target.client.nemo.registry`` pairs with this one. Torch-free.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from ..family_spec import Ask, Family

__all__ = ["Ask", "Family", "families", "family"]


@cache
def families() -> dict[str, Family]:
    """Every family module's FAMILY, by name."""
    found = {}
    for module in pkgutil.iter_modules(__path__):
        family = importlib.import_module(f"{__name__}.{module.name}").FAMILY
        if family.name != module.name:
            raise ValueError(f"protocol/families/{module.name}.py defines the family {family.name!r}")
        found[family.name] = family
    return found


def family(name: str) -> Family:
    known = families()
    if name not in known:
        raise KeyError(f"unknown draft family {name!r}; known: {', '.join(sorted(known))}")
    return known[name]
