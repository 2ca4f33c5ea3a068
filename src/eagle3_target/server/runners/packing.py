"""NeMo's packed rows for a transformers forward: the block-causal additive mask.

A packed row holds several documents back to back; each token attends to the earlier tokens of its own
document only. NeMo AutoModel's co-located EAGLE-3 and DFlash targets run SDPA/eager attention under a
[B, 1, S, S] additive mask (0 allowed, the dtype's minimum elsewhere) with per-document position_ids; the
same mask, value for value, makes the server's supervision bit-identical to theirs.
"""

from __future__ import annotations

import torch


def block_causal_mask(
    seq_lens: torch.Tensor, seq_length: int, dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """[B, 1, S, S]: 0 where query and key share a document and the key is not later, else finfo(dtype).min.

    ``seq_lens`` [B, D] holds document lengths (0-padded; the request parser checked each row sums to S).
    """
    ends = seq_lens.to(device).cumsum(dim=1)
    positions = torch.arange(seq_length, device=device)
    # the document of each position: how many documents end at or before it
    document = torch.searchsorted(ends, positions.expand(len(ends), -1).contiguous(), right=True)
    same_document = document[:, :, None] == document[:, None, :]
    allowed = same_document & (positions[None, :, None] >= positions[None, None, :])
    blocked = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device)
    return torch.where(allowed, torch.zeros((), dtype=dtype, device=device), blocked)[:, None]
