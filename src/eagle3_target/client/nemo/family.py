"""A draft family on the trainer: what ``client/nemo/families/<name>.py`` (or an entry point of the
``eagle3_target.families`` group, registry.py) declares as its ``FAMILY``.

The request and the one-time weights are the protocol's (``protocol/families/<name>.py``, the same name, or
the declaration's own ``protocol``); this adds what only the trainer knows: the NeMo recipes it trains,
which of NeMo's co-located target wrappers the fleet replaces, the adapter module that defines the recipe
classes (imported only when one of them is asked for, loading.py), and, optionally, the offline cache
`eagle3-target precompute --family <name>` writes. Names only, no classes: torch-free, NeMo-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eagle3_target.protocol.families import Family, family


@dataclass(frozen=True)
class OfflineCache:
    """NeMo's offline cache for a family, written by the fleet (client/precompute/)."""

    # "module:function", imported when the cache is written (loading.offline_cache_writer):
    # (precompute's parsed arguments, the auth token) -> the run's closed Progress
    writer: str
    # precompute's flags only this cache takes, with their defaults: given to another family's run, refused
    flags: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FleetFamily:
    name: str  # protocol/families/<name>.py, client/nemo/families/<name>.py and client/nemo/<name>.py
    recipes: tuple[str, ...]  # NeMo AutoModel 0.7.0's recipe classes it trains
    replaces: str  # NeMo's co-located target wrapper that the fleet stands in for (the recipe's fleet_target)
    # A recipe_args flag that picks this family inside a recipe another family defines (P-EAGLE is
    # TrainEagle3Recipe with parallel_drafting: true); None: the recipe classes are this module's.
    selected_by: str | None = None
    offline_cache: OfflineCache | None = None
    # The module defining the recipe classes; None: client/nemo/<name>.py. A family from outside names its own.
    adapter: str | None = None
    # What the server is asked (the exact and compact requests, the weights); None: protocol/families/<name>.py
    protocol: Family | None = None

    @property
    def adapter_module(self) -> str:
        return self.adapter or f"eagle3_target.client.nemo.{self.name}"

    @property
    def request(self) -> Family:
        """What the server sees of it: the exact and compact requests and the one-time weights."""
        return self.protocol if self.protocol is not None else family(self.name)

    @property
    def recipe_label(self) -> str:
        """The recipes as the docs and train-draft's list name them."""
        names = ", ".join(f"`{r}`" for r in self.recipes)
        return f"{names} with `{self.selected_by}: true`" if self.selected_by else names
