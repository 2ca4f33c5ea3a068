"""The ``remote_target:`` section every fleet recipe takes, beside NeMo's own YAML for that recipe.

remote_target:
  endpoints: srv://_http._tcp.llama-targets.default.svc.cluster.local  # default: $EAGLE3_TARGET_SERVICE
  auth_token_file: /var/run/eagle3-target/token  # default: $EAGLE3_TARGET_AUTH_TOKEN_FILE
  wait_timeout: 60  # seconds to let the discovered servers join before the recipe sizes its prefetch
  max_in_flight: 1  # ... and any other client option (PoolOptions fields, nameserver, device)
  seed: 42  # optional: seed torch before setup (NeMo's recipe, and ours without it, keep the caller's seed)
"""

from __future__ import annotations

from typing import Any

import torch

from ..endpoints import EndpointError, default_spec, parse_specs, read_auth_token
from .backend import split_options

DEFAULT_WAIT_TIMEOUT = 60.0


def backend_settings(section: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """RemoteTargetBackend's keyword arguments and the join wait, from the ``remote_target`` section."""
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


class RemoteTargetSection:
    """Mixed in before a NeMo recipe class: reads ``remote_target`` in __init__ (so a bad section fails
    before any slow work) and seeds torch before setup() when ``remote_target.seed`` asks.

    ``recipe_keys``: keys of the section that the recipe itself reads (``self.recipe_settings``), not
    the client."""

    recipe_keys: tuple[str, ...] = ()

    def __init__(self, cfg):
        section = cfg.get("remote_target", None)
        settings = section.to_dict() if section is not None else {}
        self.seed = seed_setting(settings.pop("seed", None))
        self.recipe_settings = {k: settings.pop(k) for k in self.recipe_keys if k in settings}
        self.remote_target = backend_settings(settings)
        super().__init__(cfg)

    def setup(self):
        # NeMo builds the draft's initial weights from torch's global RNG, which its recipes leave to the
        # caller; only an explicit remote_target.seed seeds it here.
        if self.seed is not None:
            torch.manual_seed(self.seed)
        super().setup()
