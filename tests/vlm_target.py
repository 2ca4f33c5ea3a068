"""examples/nemo/make_vlm_data.py's tiny random Qwen2.5-VL, for any test that serves an image-text target."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch
from tools import REPO

_EXAMPLES = str(REPO / "examples" / "nemo")
SEQ, PER_IMAGE = 16, 4  # a 56x56 image: 4x4 patches of 14 px, merged 2x2 into 4 image tokens


def make_vlm_data():
    """examples/nemo/make_vlm_data.py (which imports its neighbour make_data.py) as a module."""
    if _EXAMPLES not in sys.path:
        sys.path.insert(0, _EXAMPLES)
    return importlib.import_module("make_vlm_data")


def write_vlm_target(path: Path, embedding_scale: float = 2.0) -> list[str]:
    """The target's weights, tokenizer and chat template in ``path``; returns the tokenizer's plain words."""
    return make_vlm_data().write_target(path, embedding_scale)


def image_batch(model, images_per_row: int = 1, seed: int = 0) -> dict[str, torch.Tensor]:
    """Two rows of words, each with its images' placeholders, and the processor's tensors for them."""
    config, gen = model.config, torch.Generator().manual_seed(seed)
    ids = torch.randint(7, 900, (2, SEQ), generator=gen)
    for row in range(2):
        for image in range(images_per_row):
            start = 2 + image * (PER_IMAGE + 2)
            ids[row, start] = config.vision_start_token_id
            ids[row, start + 1 : start + 1 + PER_IMAGE] = config.image_token_id
            ids[row, start + 1 + PER_IMAGE] = config.vision_end_token_id
    images = 2 * images_per_row
    grid = torch.tensor([[1, 4, 4]] * images, dtype=torch.int64)
    patch_dim = 3 * 2 * 14 * 14
    pixels = torch.randn(16 * images, patch_dim, generator=gen).to(torch.bfloat16)
    return dict(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        loss_mask=torch.ones_like(ids),
        pixel_values=pixels,
        image_grid_thw=grid,
        mm_token_type_ids=(ids == config.image_token_id).long(),
    )
