"""A transformers model's weights as a checkpoint names them, and new values copied into them in place
(refresh.py stages and checks the new values first, so the copy cannot fail halfway)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn


def checkpoint_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict's tensors, each once: a tied weight under its first name (the one save_pretrained
    keeps), buffers only where persistent (state_dict leaves the others out)."""
    seen: set[int] = set()
    named = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            named[name] = tensor.detach()
    return named


@torch.no_grad()
def copy_into(served: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor]) -> None:
    """Each new value into the served tensor of its name, in its dtype and on its device."""
    for name, tensor in new.items():
        served[name].copy_(tensor)
