"""The ``remote_target:`` section of a NeMo recipe YAML, for the recipes NeMo gives no remote path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .recipe import backend_settings, seed_setting


@dataclass
class RemoteSection:
    backend: dict[str, Any]  # endpoints, auth_token and client options, for open_backend
    wait_timeout: float
    seed: int | None = None
    family: dict[str, Any] = field(default_factory=dict)  # the family's own options

    @classmethod
    def from_config(cls, cfg, family_options: tuple[str, ...] = ()) -> RemoteSection:
        section = cfg.get("remote_target", None)
        settings = section.to_dict() if section is not None else {}
        seed = seed_setting(settings.pop("seed", None))
        family = {k: settings.pop(k) for k in family_options if k in settings}
        for key in ("logits_on_trainer",):
            if key in family and not isinstance(family[key], bool):
                raise ValueError(f"remote_target.{key}={family[key]!r}: true or false")
        depth = family.get("prefetch_depth")
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
            raise ValueError(f"remote_target.prefetch_depth={depth!r}: a whole number >= 0")
        backend, wait_timeout = backend_settings(settings)
        return cls(backend, wait_timeout, seed, family)

    def seed_torch(self) -> None:
        # NeMo builds the draft's initial weights from torch's global RNG, which its recipes leave to the
        # caller; only an explicit remote_target.seed seeds it here.
        if self.seed is not None:
            torch.manual_seed(self.seed)

    def prefetch_depth(self, target) -> int:
        """Batches captured ahead of the training step: remote_target.prefetch_depth, else one per server."""
        depth = self.family.get("prefetch_depth")
        return target.num_remote_servers if depth is None else depth
