"""Packed-row engines (SGLang, vLLM) take each row's tokens back to back, without padding."""

from __future__ import annotations

import torch

from ..errors import InvalidInput


def row_lengths(attention_mask: torch.Tensor, engine: str) -> torch.Tensor:
    """Each row's length; a packed engine takes rows without holes, so the mask must be ones then zeros."""
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1)
    prefix = torch.arange(mask.shape[1], device=mask.device) < lengths[:, None]
    if not torch.equal(mask, prefix):
        raise InvalidInput(
            "unsupported_padding",
            f"the {engine} engine needs right-padded rows: each mask row is ones, then zeros",
        )
    return lengths


def stack_rows(flat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[T, D] tokens packed row after row -> [B, S, D], zeros past each row's length."""
    if mask.all():
        return flat.view(*mask.shape, flat.shape[-1])
    out = flat.new_zeros(*mask.shape, flat.shape[-1])
    out[mask] = flat
    return out
