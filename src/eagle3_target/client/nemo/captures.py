"""What a trainer derives from a capture with NeMo's own ops (a copy or a concatenation: exact). Torch only,
so the offline caches (client/precompute/) share them without loading a recipe."""

from __future__ import annotations

import torch


def shift_left(tensor: torch.Tensor) -> torch.Tensor:
    """NeMo's ``_shift_left_with_zero``: drop the first position, append a zero one."""
    return torch.cat((tensor[:, 1:], torch.zeros_like(tensor[:, :1])), dim=1)


def dspark_context(
    captured: dict[str, torch.Tensor], target_layer_ids: list[int], num_layers: int
) -> torch.Tensor:
    """NeMo's DSpark context [B, S, n*H] from what the dspark family asks (its ask() sends the last layer,
    whose feature is the post-norm state, once as final_hidden): the layers in order, the post-norm state
    in the last layer's place (a copy: exact)."""
    final = captured["final_hidden"]
    width, start, pieces = final.shape[-1], 0, []
    for layer_id in target_layer_ids:
        if layer_id == num_layers - 1:
            pieces.append(final)
        else:
            pieces.append(captured["hidden_states"][..., start : start + width])
            start += width
    return torch.cat(pieces, dim=-1)
