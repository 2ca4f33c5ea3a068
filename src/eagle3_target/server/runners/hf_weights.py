"""A transformers model's weights as a checkpoint names them, and new values copied into them in place
(refresh.py stages and checks the new values first, so the copy cannot fail halfway)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

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
def copy_into(served: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor]) -> None:
    """Each new value into the served tensor of its name, in its dtype and on its device."""
    for name, tensor in new.items():
        served[name].copy_(tensor)


SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "BOOL": torch.bool,
}


def file_layout(folder: str, engine: str) -> dict[str, torch.Tensor]:
    """The tensors of a local checkpoint folder as meta tensors (names, shapes, dtypes from the files' headers,
    no data read): the layout an engine that keeps its weights in its own workers serves."""
    files = sorted(Path(folder).glob("*.safetensors")) if Path(folder).is_dir() else []
    if not files:
        raise InvalidInput(
            "refresh_not_offered",
            f"the {engine} engine refreshes a model it loaded from a local folder of safetensors, not {folder}",
        )
    layout = {}
    for path in files:
        with safe_open(path, framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 - safe_open is not iterable
                piece = fh.get_slice(name)
                dtype = SAFETENSORS_DTYPES.get(piece.get_dtype(), torch.uint8)
                layout[name] = torch.empty(piece.get_shape(), dtype=dtype, device="meta")
    return layout
