"""The engines a target server runs its model with, as a table every part reads: the server's `serve` flags,
preflight, the runner loader, the rank processes, the operator and the CRD's checks.

One module per engine, each defining ``ENGINE``; ``engines()`` finds them all (docs/engines.md adds one).
The runner itself is the module the entry's ``load`` names under server/runners/. Torch-free: the operator
imports this package.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from functools import cache

TENSOR, PIPELINE = "tensor", "pipeline"
# The load options every engine's loader takes (server/cli.py runner_options); ``options`` adds to them.
COMMON_OPTIONS = ("model", "dtype", "device", "aux_layer_ids")


@dataclass(frozen=True)
class Engine:
    name: str  # the module's name and --engine's value
    summary: str  # what runs the forward, for --engine's help
    # "module:attribute" of the one-device loader; it is called with the load options (no layout)
    load: str
    # A layout of several ranks: "module:attribute" of the loader that leads them (node-rank 0), called with
    # the load options and ``parallel``; None: this engine runs one device per replica.
    load_split: str | None = None
    splits: frozenset[str] = frozenset()  # TENSOR and PIPELINE: the parallel layouts it honours
    both_at_once: bool = False  # tensor and pipeline parallel in one replica
    nodes: bool = False  # a replica across several nodes
    follow: str | None = None  # "module:attribute" a node-rank > 0 `serve` runs (with ``nodes``)
    rank: str | None = None  # "module:attribute" of a rank process's follow_group(group, options)
    devices: tuple[str, ...] = ("cpu", "cuda")  # torch device types it runs on (a GPU-only split: one node's)
    copies_kv_heads: bool = False  # tensor parallel over more ranks than KV heads, each head on several
    options: tuple[str, ...] = (
        "trust_remote_code",
    )  # `serve` options its loaders take beyond COMMON_OPTIONS
    package: str | None = None  # an optional module it needs, installed by the extra of the same name
    needs_model: bool = False  # no embedded default: --model is required
    # None: preflight reads the model's config (its layers, heads) to check the flags; a number: the engine
    # reads no config, and its runners have that many decoder layers
    layers: int | None = None
    image_text: bool = False  # loads image-text checkpoints, on one device
    fleet: bool = True  # the operator deploys it (Eagle3Target spec.engine)

    def can(self, split: str) -> bool:
        return split in self.splits

    @property
    def gpu_only(self) -> bool:
        return "cpu" not in self.devices


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


def entry(path: str):
    """The object a "module:attribute.attribute" entry names, its module imported now."""
    module, _, attributes = path.partition(":")
    value = importlib.import_module(module)
    for attribute in attributes.split("."):
        value = getattr(value, attribute)
    return value
