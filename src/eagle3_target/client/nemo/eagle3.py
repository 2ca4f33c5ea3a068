"""EAGLE-3 (NeMo's TrainEagle3Recipe) with the fleet as its remote target: EAGLE-3's fleet target (backend.py),
a FleetTarget like every family's, its request the fleet's own aux layers. With ``recipe_args.parallel_drafting: true``
the same class trains P-EAGLE (peagle.py), whose target this recipe's co-located hook opens.
"""

from __future__ import annotations

import time

from ._imports import nemo_module
from .backend import NeMoTargetBackend
from .fleet_cycles import FleetCycles
from .fleet_recipe import FleetRecipe
from .fleet_target import FleetTarget, check_dtype
from .peagle import RemotePEagleTarget

_nemo_recipe = nemo_module("recipes.llm.train_eagle3")
_target = nemo_module("components.speculative.eagle.target")


class TrainEagle3Recipe(FleetCycles, FleetRecipe, _nemo_recipe.TrainEagle3Recipe):
    """NeMo's EAGLE-3 recipe, unchanged but for where the target runs: the eagle3-target fleet (and, with
    ``regen:`` or ``decode_eval:``, where those cycles run: fleet_cycles.py)."""

    prefetches_loaders = False  # NeMo's own prefetch loop (recipe_args.target_prefetch_depth)
    # opened only for P-EAGLE (parallel_drafting); EAGLE-3's own is NeMoTargetBackend, opened from the endpoints
    fleet_target = RemotePEagleTarget

    def __init__(self, cfg):
        backend = cfg.get("recipe_args.target_model_backend", "remote")
        if backend != "remote":
            raise ValueError(
                f"recipe_args.target_model_backend={backend!r}: this recipe trains against the eagle3-target "
                "fleet (remote); use NeMo's own TrainEagle3Recipe for a co-located target"
            )
        for nemo_key in ("remote_urls", "remote_url"):
            if cfg.get(f"recipe_args.{nemo_key}", None):
                raise ValueError(
                    f"recipe_args.{nemo_key} configures NeMo's own client; "
                    "name the fleet with remote_target.endpoints instead"
                )
        self.parallel_drafting = bool(cfg.get("recipe_args.parallel_drafting", False))
        self.sharded_axes = ("cp_size", "tp_size") if self.parallel_drafting else ()
        # P-EAGLE: NeMo's gate admits only a co-located target, whose loader is the hook taken over below.
        cfg.set_by_dotted(
            "recipe_args.target_model_backend", "colocated" if self.parallel_drafting else "remote"
        )
        super().__init__(cfg)

    def check_settings(self) -> None:
        if self.remote_target.compact and not self.parallel_drafting:
            raise ValueError(
                "remote_target.compact applies to P-EAGLE (parallel_drafting: true); "
                "EAGLE-3 takes draft-vocabulary supervision (remote_target.encoding)"
            )
        super().check_settings()

    @property
    def compact(self) -> bool:
        return self.remote_target.compact

    def _setup_online_target(self, recipe_cfg, target_path, draft_base_config):
        packed = int(recipe_cfg.get("packed_sequence_size", 0) or 0)
        if packed <= 0:
            return super()._setup_online_target(recipe_cfg, target_path, draft_base_config)
        # NeMo lets only its co-located target, named by the backend, take packed rows ("the remote backend
        # does not propagate per-document masking"). The fleet computes them as that target does, so the
        # setup runs under its name and _setup_colocated_target connects the fleet; the gates NeMo keeps
        # for a remote target (no context or tensor parallelism) are checked here first.
        cp_size = int(self.cfg.get("distributed.cp_size", 1) or 1)
        _nemo_recipe._validate_cp_gates(cp_size, "remote", packed, cp_mode=recipe_cfg.get("cp_mode", "ring"))
        _nemo_recipe._validate_tp_gates(int(self.cfg.get("distributed.tp_size", 1) or 1), "remote", cp_size)
        self.cfg.set_by_dotted("recipe_args.target_model_backend", "colocated")
        try:
            return super()._setup_online_target(recipe_cfg, target_path, draft_base_config)
        finally:
            self.cfg.set_by_dotted("recipe_args.target_model_backend", "remote")

    def _prefetched_batches(self, dataloader):
        # NeMo's prefetch loop passes the target input_ids, attention_mask and loss_mask only
        if isinstance(self.target_wrapper, FleetTarget):
            dataloader = self.target_wrapper.noting_packing(dataloader)
        return super()._prefetched_batches(dataloader)

    def _setup_remote_target(self, recipe_cfg):
        settings = self.remote_target
        packing = int(recipe_cfg.get("packed_sequence_size", 0) or 0) > 0
        self.target_model = None
        started = time.monotonic()
        self.target_wrapper = NeMoTargetBackend(
            settings.endpoints,
            settings.auth_token,
            device=self.device,
            ranks_share_weights=True,
            **{**settings.client_options, "packing": packing},
        )
        # NeMo caps its prefetch depth at num_remote_servers, read later in setup(): let every server
        # that discovery found join first (the backend returns as soon as the first one is ready).
        self.target_wrapper.wait_for_servers(settings.wait_left(started))
        # NeMo's co-located target computes in the draft's dtype: a fleet in another one is refused at setup
        check_dtype(getattr(self, "compute_dtype", None), self.target_wrapper.model_info())
        self.check_target(self.target_wrapper.model_info())  # and the recipe's target, by its config

    def _setup_colocated_target(self, recipe_cfg, target_path, draft_base_config):
        if not self.parallel_drafting:
            # packed rows (_setup_online_target): the fleet stands in for NeMo's co-located target
            return self._setup_remote_target(recipe_cfg)
        # P-EAGLE: the fleet captures the aux layers NeMo's co-located HFEagle3TargetModel would.
        num_layers = draft_base_config.num_hidden_layers
        layers = recipe_cfg.get("aux_layer_ids", None)
        if layers is None:
            layers = _target.default_eagle3_aux_layer_ids(num_layers)
        self.target_model = None
        self.target_wrapper = self.open_fleet_target(
            _target.validate_eagle3_aux_layer_ids(layers, num_layers), num_layers
        )
