"""A transformers model's weights as a checkpoint names them, and new values served in their place
(refresh.py stages and checks the new values first, so the swap cannot fail halfway)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from ..checkpoint_read import read_header
from ..errors import InvalidInput


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
def swap_in(model: nn.Module, new: Mapping[str, torch.Tensor]) -> None:
    """Each new value served under its checkpoint name. One already of the served tensor's dtype, device and
    shape becomes the served tensor's storage (double-buffered: the old storage is freed with its last
    reference, nothing is copied); any other is copied into the served tensor (a GPU's weights, from host)."""
    held = model.state_dict(keep_vars=True)  # the parameters and buffers themselves, not views of them
    for name, tensor in new.items():
        served = held[name]
        if (tensor.dtype, tensor.device, tensor.shape) == (served.dtype, served.device, served.shape):
            served.data = tensor
        else:
            served.copy_(tensor)


def file_layout(folder: str, engine: str) -> dict[str, torch.Tensor]:
    """The tensors of a local checkpoint folder as meta tensors (names, shapes, dtypes from the files' headers,
    no data read): the layout an engine that keeps its weights in its own workers serves."""
    files = sorted(Path(folder).glob("*.safetensors")) if Path(folder).is_dir() else []
    if not files:
        raise InvalidInput(
            "refresh_not_offered",
            f"the {engine} engine refreshes a model it loaded from a local folder of safetensors, not {folder}",
        )
    try:
        headers = [read_header(path, str(path)) for path in files]
    except InvalidInput as exc:  # the served files, not a source: a dtype this server cannot stage, say
        raise InvalidInput(
            "refresh_not_offered", f"the {engine} engine cannot refresh {exc.detail}"
        ) from None
    return {
        name: torch.empty(entry.shape, dtype=entry.dtype, device="meta")
        for header in headers
        for name, entry in header.items()
    }
