"""The engines a target server runs its model with, as a table every part reads: the server's `serve` flags,
preflight, the runner loader, the rank processes, the operator and the CRD's checks.

One module per engine, each defining ``ENGINE`` (an ``engine_spec.Engine``); ``engines()`` finds them all
(docs/engines.md adds one). The runner itself is the module the entry's ``load`` names under server/runners/.
Torch-free: the operator imports this package.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from ..engine_spec import Engine


@cache
def engines() -> dict[str, Engine]:
    """Every engine module's ENGINE, by name."""
    found = {}
    for module in pkgutil.iter_modules(__path__):
        engine = importlib.import_module(f"{__name__}.{module.name}").ENGINE
        if engine.name != module.name:
            raise ValueError(f"protocol/engines/{module.name}.py defines the engine {engine.name!r}")
        found[engine.name] = engine
    return found


def engine(name: str) -> Engine:
    known = engines()
    if name not in known:
        raise KeyError(f"unknown engine {name!r}; choose one of {', '.join(sorted(known))}")
    return known[name]


def fleet_engines() -> tuple[str, ...]:
    """The engines an Eagle3Target may name."""
    return tuple(sorted(name for name, e in engines().items() if e.fleet))
