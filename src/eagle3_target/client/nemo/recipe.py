"""NeMo's TrainEagle3Recipe with the fleet as its remote target, configured by a ``remote_target:`` section
(remote.py describes it).

With ``recipe_args.parallel_drafting: true`` (P-EAGLE) the fleet sends what NeMo's co-located target
computes (peagle.py); ``remote_target.compact: true`` has it send the post-norm hidden state instead of
full-vocabulary logits, and the trainer applies the target's lm_head.
"""

from __future__ import annotations

from ._imports import nemo_module
from .backend import NeMoTargetBackend
from .remote import RemoteTargetSection

_nemo_recipe = nemo_module("recipes.llm.train_eagle3")


class TrainEagle3Recipe(RemoteTargetSection, _nemo_recipe.TrainEagle3Recipe):
    """NeMo's EAGLE-3 recipe, unchanged but for where the target runs: the eagle3-target fleet."""

    recipe_keys = ("compact",)

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
        for axis in ("cp_size", "tp_size"):
            if self.parallel_drafting and int(cfg.get(f"distributed.{axis}", 1) or 1) > 1:
                raise ValueError(f"distributed.{axis}>1 shards a co-located target; the fleet runs it whole")
        # P-EAGLE: NeMo's gate admits only a co-located target, whose loader is the hook taken over below.
        cfg.set_by_dotted(
            "recipe_args.target_model_backend", "colocated" if self.parallel_drafting else "remote"
        )
        super().__init__(cfg)
        self.compact = self.recipe_settings.get("compact", False)
        if not isinstance(self.compact, bool):
            raise ValueError(f"remote_target.compact={self.compact!r}: true or false")
        if self.compact and not self.parallel_drafting:
            raise ValueError(
                "remote_target.compact applies to P-EAGLE (parallel_drafting: true); "
                "EAGLE-3 takes draft-vocabulary supervision (remote_target.encoding)"
            )

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
        if isinstance(self.target_wrapper, NeMoTargetBackend):
            dataloader = self.target_wrapper.noting_packing(dataloader)
        return super()._prefetched_batches(dataloader)

    def _setup_remote_target(self, recipe_cfg):
        kwargs, wait_timeout = self.remote_target
        packing = int(recipe_cfg.get("packed_sequence_size", 0) or 0) > 0
        self.target_model = None
        self.target_wrapper = NeMoTargetBackend(
            device=self.device, ranks_share_weights=True, **{**kwargs, "packing": packing}
        )
        # NeMo caps its prefetch depth at num_remote_servers, read later in setup(): let every server
        # that discovery found join first (the backend returns as soon as the first one is ready).
        self.target_wrapper.wait_for_servers(wait_timeout)

    def _setup_colocated_target(self, recipe_cfg, target_path, draft_base_config):
        if not self.parallel_drafting:
            # packed rows (_setup_online_target): the fleet stands in for NeMo's co-located target
            return self._setup_remote_target(recipe_cfg)
        # P-EAGLE: the fleet captures what NeMo's HFEagle3TargetModel would.
        from .peagle import open_peagle_target

        self.target_model = None
        self.target_wrapper = open_peagle_target(
            self.remote_target,
            self.device,
            recipe_cfg.get("aux_layer_ids", None),
            draft_base_config.num_hidden_layers,
            self.compact,
        )
