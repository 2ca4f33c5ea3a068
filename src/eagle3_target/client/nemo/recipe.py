"""NeMo's TrainEagle3Recipe with the fleet as its remote target, configured by a ``remote_target:`` section.

remote_target:
  endpoints: srv://_http._tcp.llama-targets.default.svc.cluster.local  # default: $EAGLE3_TARGET_SERVICE
  auth_token_file: /var/run/eagle3-target/token  # default: $EAGLE3_TARGET_AUTH_TOKEN_FILE
  wait_timeout: 60  # seconds to let the discovered servers join before NeMo sizes its prefetch
  max_in_flight: 1  # ... and any other client option (PoolOptions fields, nameserver, device)
  seed: 42  # optional: seed torch before setup (NeMo's recipe, and ours without it, keep the caller's seed)

With ``recipe_args.parallel_drafting: true`` (P-EAGLE) the fleet sends what NeMo's co-located target
computes (peagle.py); ``remote_target.logits_on_trainer: true`` has it send the post-norm hidden state
and applies the target's lm_head here instead of shipping full-vocabulary logits.
"""

from __future__ import annotations

from typing import Any

import torch

from ..endpoints import EndpointError, default_spec, parse_specs, read_auth_token
from ._imports import nemo_module
from .backend import NeMoTargetBackend, split_options
from .features import open_backend

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
        self.parallel_drafting = bool(cfg.get("recipe_args.parallel_drafting", False))
        # P-EAGLE: NeMo's gate admits only a co-located target, whose loader is the hook we take over.
        cfg.set_by_dotted("recipe_args.target_model_backend", "colocated" if self.parallel_drafting else "remote")
        section = cfg.get("remote_target", None)
        settings = section.to_dict() if section is not None else {}
        self.seed = seed_setting(settings.pop("seed", None))
        self.logits_on_trainer = bool(settings.pop("logits_on_trainer", False))
        if self.logits_on_trainer and not self.parallel_drafting:
            raise ValueError(
                "remote_target.logits_on_trainer applies to P-EAGLE (parallel_drafting: true); "
                "EAGLE-3 takes draft-vocabulary supervision (remote_target.encoding)"
            )
        self.remote_target = backend_settings(settings)
        super().__init__(cfg)

    def setup(self):
        # NeMo builds the draft's initial weights from torch's global RNG, which its recipe leaves to the
        # caller; only an explicit remote_target.seed seeds it here.
        if self.seed is not None:
            torch.manual_seed(self.seed)
        super().setup()

    def _setup_remote_target(self, recipe_cfg):
        kwargs, wait_timeout = self.remote_target
        self.target_model = None
        self.target_wrapper = NeMoTargetBackend(device=self.device, **kwargs)
        # NeMo caps its prefetch depth at num_remote_servers, read later in setup(): let every server
        # that discovery found join first (the backend returns as soon as the first one is ready).
        self.target_wrapper.wait_for_servers(wait_timeout)

    def _setup_colocated_target(self, recipe_cfg, target_path, draft_base_config):
        # Reached only for P-EAGLE: the fleet captures what NeMo's HFEagle3TargetModel would.
        from .peagle import RemotePEagleTarget

        for axis in ("cp_size", "tp_size"):
            if int(self.cfg.get(f"distributed.{axis}", 1) or 1) > 1:
                raise ValueError(f"distributed.{axis} shards a co-located target; the fleet runs it whole")
        target_module = nemo_module("components.speculative.eagle.target")
        layers = recipe_cfg.get("aux_layer_ids", None)
        depth = draft_base_config.num_hidden_layers
        layers = target_module.validate_eagle3_aux_layer_ids(
            layers if layers is not None else target_module.default_eagle3_aux_layer_ids(depth), depth
        )
        kwargs, wait_timeout = self.remote_target
        request = RemotePEagleTarget.request(aux_layer_ids=layers, logits_on_trainer=self.logits_on_trainer)
        remote = open_backend(request, self.device, kwargs)
        self.target_model = None
        self.target_wrapper = RemotePEagleTarget(remote, self.device, logits_on_trainer=self.logits_on_trainer)
        self.target_wrapper.wait_for_servers(wait_timeout)
