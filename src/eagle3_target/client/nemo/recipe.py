"""NeMo's TrainEagle3Recipe with the fleet as its remote target, configured by a ``remote_target:`` section
(remote.py describes it)."""

from __future__ import annotations

from ._imports import nemo_module
from .backend import NeMoTargetBackend
from .remote import RemoteTargetSection

_nemo_recipe = nemo_module("recipes.llm.train_eagle3")


class TrainEagle3Recipe(RemoteTargetSection, _nemo_recipe.TrainEagle3Recipe):
    """NeMo's EAGLE-3 recipe, unchanged but for where the target runs: the eagle3-target fleet."""

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
        cfg.set_by_dotted("recipe_args.target_model_backend", "remote")
        super().__init__(cfg)

    def _setup_remote_target(self, recipe_cfg):
        kwargs, wait_timeout = self.remote_target
        self.target_model = None
        self.target_wrapper = NeMoTargetBackend(device=self.device, **kwargs)
        # NeMo caps its prefetch depth at num_remote_servers, read later in setup(): let every server
        # that discovery found join first (the backend returns as soon as the first one is ready).
        self.target_wrapper.wait_for_servers(wait_timeout)
