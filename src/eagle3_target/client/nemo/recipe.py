"""NeMo's TrainEagle3Recipe with the fleet as its remote target, configured by a ``remote_target:`` section.

remote_target:
  endpoints: srv://_http._tcp.llama-targets.default.svc.cluster.local  # default: $EAGLE3_TARGET_SERVICE
  auth_token_file: /var/run/eagle3-target/token  # default: $EAGLE3_TARGET_AUTH_TOKEN_FILE
  wait_timeout: 60  # seconds to let the discovered servers join before NeMo sizes its prefetch
  max_in_flight: 1  # ... and any other client option (PoolOptions fields, nameserver, device)
  seed: 42  # optional: seed torch before setup (NeMo's recipe, and ours without it, keep the caller's seed)
"""

from __future__ import annotations

from typing import Any

import torch

from ..endpoints import EndpointError, default_spec, parse_specs, read_auth_token
from ._imports import nemo_module
from .backend import NeMoTargetBackend, split_options

_nemo_recipe = nemo_module("recipes.llm.train_eagle3")

DEFAULT_WAIT_TIMEOUT = 60.0


def backend_settings(section: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """NeMoTargetBackend's keyword arguments and the join wait, from the ``remote_target`` section."""
    options = dict(section)
    endpoints = options.pop("endpoints", None) or default_spec()
    parse_specs(endpoints if isinstance(endpoints, str) else ",".join(endpoints))  # fail before NeMo loads
    token_file = options.pop("auth_token_file", None)
    wait_timeout = float(options.pop("wait_timeout", DEFAULT_WAIT_TIMEOUT))
    try:
        token = read_auth_token(token_file)
    except EndpointError as exc:
        raise EndpointError(f"remote_target.auth_token_file={exc}" if token_file else str(exc)) from None
    split_options(options)  # a misspelt option fails here too
    return dict(endpoints=endpoints, auth_token=token, **options), wait_timeout


def seed_setting(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"remote_target.seed={value!r}: an integer, or leave it out to keep the caller's seed"
        )
    return value


class TrainEagle3Recipe(_nemo_recipe.TrainEagle3Recipe):
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
        section = cfg.get("remote_target", None)
        settings = section.to_dict() if section is not None else {}
        self.seed = seed_setting(settings.pop("seed", None))
        self.remote_target = backend_settings(settings)
        super().__init__(cfg)

    def setup(self):
        # NeMo builds the draft's initial weights from torch's global RNG, which its recipe leaves to the
        # caller; only an explicit remote_target.seed seeds it here.
        if self.seed is not None:
            torch.manual_seed(self.seed)
        super().setup()

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

    def _setup_colocated_target(self, recipe_cfg, target_path, draft_base_config):
        # reached only from the packed path above: the fleet stands in for NeMo's co-located target
        self._setup_remote_target(recipe_cfg)

    def _prefetched_batches(self, dataloader):
        # NeMo's prefetch loop passes the target input_ids, attention_mask and loss_mask only
        return super()._prefetched_batches(self.target_wrapper.noting_packing(dataloader))

    def _setup_remote_target(self, recipe_cfg):
        kwargs, wait_timeout = self.remote_target
        packing = int(recipe_cfg.get("packed_sequence_size", 0) or 0) > 0
        self.target_model = None
        self.target_wrapper = NeMoTargetBackend(device=self.device, **{**kwargs, "packing": packing})
        # NeMo caps its prefetch depth at num_remote_servers, read later in setup(): let every server
        # that discovery found join first (the backend returns as soon as the first one is ready).
        self.target_wrapper.wait_for_servers(wait_timeout)
