"""A draft family on the trainer: what ``client/nemo/<name>.py`` declares as its ``FAMILY``.

The request and the one-time weights are the protocol's (``protocol/families/<name>.py``, the same name);
this adds what only the trainer knows: the NeMo recipes it trains, which of NeMo's co-located target
wrappers the fleet replaces, the class that turns a capture into NeMo's batch, and, optionally, the
offline cache `eagle3-target precompute --family <name>` writes. Torch-free, NeMo-free.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eagle3_target.protocol.families import Family, family


@dataclass(frozen=True)
class OfflineCache:
    """NeMo's offline cache for a family, written by the fleet (client/precompute/)."""

    # (precompute's parsed arguments, the auth token) -> the run's closed Progress
    write: Callable[[argparse.Namespace, str | None], Any]
    # precompute's flags only this cache takes, with their defaults: given to another family's run, refused
    flags: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FleetFamily:
    name: str  # protocol/families/<name>.py and client/nemo/<name>.py
    recipes: tuple[str, ...]  # NeMo AutoModel 0.7.0's recipe classes it trains
    replaces: str  # NeMo's co-located target wrapper that the fleet stands in for
    # The FleetTarget the recipe calls as it calls ``replaces``; its ``to_batch`` builds NeMo's batch from a capture.
    # FleetRecipe.open_fleet_target opens it, but EAGLE-3's (NeMoTargetBackend) opens from endpoints, as NeMo's does.
    target: type
    # A recipe_args flag that picks this family inside a recipe another family defines (P-EAGLE is
    # TrainEagle3Recipe with parallel_drafting: true); None: the recipe classes are this module's.
    selected_by: str | None = None
    offline_cache: OfflineCache | None = None

    @property
    def request(self) -> Family:
        """What the server sees of it: the exact and compact requests and the one-time weights."""
        return family(self.name)

    @property
    def recipe_label(self) -> str:
        """The recipes as the docs and train-draft's list name them."""
        names = ", ".join(f"`{r}`" for r in self.recipes)
        return f"{names} with `{self.selected_by}: true`" if self.selected_by else names
