"""`FleetRecipe`: what every remote recipe does around NeMo's, written once. Mixed in before NeMo's recipe
class, it reads ``remote_target:`` (remote.py) before any slow work, refuses the parallelism that shards a
co-located target, seeds torch when asked, opens the fleet for its family when NeMo builds the target
(checking the draft's dtype and the recipe's target against the fleet's), wraps the loaders for prefetch and closes the fleet when
the loop ends. A family's adapter says only where NeMo builds its target (``fleet_setup`` or one of NeMo's
hooks calling ``open_fleet_target``) and how a capture becomes NeMo's batch (its FleetTarget).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

from .family import FleetFamily
from .fleet_target import FleetTarget, open_backend
from .registry import by_recipe
from .remote import RemoteTargetSettings
from .target_check import check_target


class FleetRecipe:
    # distributed axes that shard a co-located target: refused, the fleet runs it whole
    sharded_axes: tuple[str, ...] = ("tp_size",)
    # the FleetTarget opened where NeMo builds its co-located target; its to_batch builds NeMo's batch
    fleet_target: type[FleetTarget]
    # the recipe's loops ask for each batch's features when they reach it: the loaders submit ahead
    # (remote_target.prefetch_depth); False: NeMo's own prefetch (recipe_args.target_prefetch_depth)
    prefetches_loaders = True

    def __init__(self, cfg):
        for axis in self.sharded_axes:
            if int(cfg.get(f"distributed.{axis}", 1) or 1) > 1:
                raise ValueError(
                    f"distributed.{axis}>1 shards a co-located target; with remote_target the fleet holds the "
                    "target, so the trainer takes only data parallelism (leave it at 1)"
                )
        section = cfg.get("remote_target", None)
        self.remote_target = RemoteTargetSettings.parse(section.to_dict() if section is not None else None)
        recipe_args = cfg.get("recipe_args", None)
        self.family: FleetFamily = by_recipe(type(self).__name__, recipe_args)
        self.check_settings()
        super().__init__(cfg)

    def check_settings(self) -> None:
        settings, name = self.remote_target, type(self).__name__
        if settings.compact and self.family.request.compact is None:
            raise ValueError(f"remote_target.compact: {name} has no compact request; its exact one is small")
        if settings.prefetch_depth is not None and not self.prefetches_loaders:
            raise ValueError(
                f"remote_target.prefetch_depth: {name} prefetches as NeMo does "
                "(recipe_args.target_prefetch_depth)"
            )

    def fleet_setup(self):
        """Around NeMo's setup(): where a recipe without a target hook has its target swapped (takeover.py)."""
        return contextlib.nullcontext()

    def setup(self):
        # NeMo builds the draft's initial weights from torch's global RNG, which its recipes leave to the
        # caller; only an explicit remote_target.seed seeds it here.
        with self.fleet_setup():
            if self.remote_target.seed is not None:
                torch.manual_seed(self.remote_target.seed)
            super().setup()
        if self.prefetches_loaders:
            self.target_wrapper.prefetched.wrap_loaders(self)

    def open_fleet_target(self, layers: Sequence[int] = (), num_layers: int = 0, **extra) -> FleetTarget:
        """The family's FleetTarget over the fleet, asking for ``layers`` of a ``num_layers``-layer target."""
        backend, weights = open_backend(
            self.family.request,
            self.device,
            self.remote_target,
            layers,
            num_layers,
            draft_dtype=getattr(self, "compute_dtype", None),
            check_info=self.check_target,
        )
        return self.fleet_target(
            backend, weights, self.device, self.remote_target, layers, num_layers, **extra
        )

    def check_target(self, info: dict) -> None:
        """The fleet's /model_info against the recipe's own target (target_check.py)."""
        check_target(self.cfg.get("recipe_args", None), info, self.remote_target.allow_target_mismatch)

    def run_train_validation_loop(self):
        try:
            super().run_train_validation_loop()
        finally:
            if self.target_wrapper is not None:  # closing twice is harmless (NeMo's EAGLE-3 closes it too)
                self.target_wrapper.close()  # ends our sessions on the servers
