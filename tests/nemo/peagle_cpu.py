"""The CPU shim P-EAGLE needs (tests only): flex attention has no CPU backward in torch 2.13, so P-EAGLE's
attention is computed as dense SDPA under the mask its flex BlockMask stands for. Both runs of an exactness
test use it; a train-draft subprocess installs it with ``python -c`` (``COMMAND``)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from nemo_automodel.components.speculative.eagle import peagle_draft


def dense_peagle_attention(q, k, v, *, block_mask, scale):
    idx = torch.arange(q.shape[-2], device=q.device)
    mask = block_mask.mask_mod(0, 0, idx[:, None], idx[None, :])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def install() -> None:
    peagle_draft._peagle_flex_attention = dense_peagle_attention


# `python -c COMMAND train-draft ...`: eagle3-target's CLI with the shim installed.
COMMAND = (
    f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import peagle_cpu; peagle_cpu.install(); "
    "from eagle3_target.cli import main; sys.exit(main(sys.argv[1:]))"
)
