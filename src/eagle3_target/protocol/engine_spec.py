"""What an engine is, as the engine table (protocol/engines/) describes it: what it can split, across nodes
or not, the devices it runs on, what its loaders take, and where its runner modules are. Torch-free.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

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


def entry(path: str):
    """The object a "module:attribute.attribute" entry names, its module imported now."""
    module, _, attributes = path.partition(":")
    value = importlib.import_module(module)
    for attribute in attributes.split("."):
        value = getattr(value, attribute)
    return value
