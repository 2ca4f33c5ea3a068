"""Image inputs on a feature request to an image-text target: checked against the target before any work.

A trainer sends what its processor made (contract.IMAGE_KEYS): pixel_values [patches, patch_dim] in the
dtype the data pipeline chose (NeMo casts them to bfloat16; they reach the model as sent), image_grid_thw
int64 [images, 3], optionally mm_token_type_ids [B, S]. Each failure is a ServiceError (a 4xx).
"""

from __future__ import annotations

import torch

from eagle3_target.protocol.contract import IMAGE_KEYS

from .errors import InvalidInput, TooLarge
from .runners import RunnerInfo

MAX_IMAGES = 4096  # grids past this are no batch a trainer sends
MAX_GRID = 1 << 16  # patches along one axis: far beyond any image, and no int64 product overflows


def check_images(
    inputs: dict[str, torch.Tensor], info: RunnerInfo, has_features: bool, max_image_tokens: int
) -> None:
    """Raise unless ``inputs``' images (if any) are ones this target can take for this request."""
    given = [k for k in IMAGE_KEYS if k in inputs]
    if not given:
        return
    if info.image_spec is None:
        raise InvalidInput("images_not_accepted", f"this server's target ({info.model}) takes text only")
    if not has_features:
        raise InvalidInput("images_without_features", "images go with a feature request (X-Eagle3-Features)")
    if "seq_lens" in inputs:
        raise InvalidInput("images_with_packing", "packed rows cannot carry images: send unpacked rows")
    pixels, grid = inputs.get("pixel_values"), inputs.get("image_grid_thw")
    if pixels is None or grid is None:
        raise InvalidInput("bad_images", "images need both pixel_values and image_grid_thw")
    tokens = _image_tokens(grid, info.image_spec.merge)
    if tokens > max_image_tokens:
        raise TooLarge(
            "too_many_image_tokens",
            f"the images take {tokens} image tokens; this server takes at most {max_image_tokens} "
            "per request (--max-image-tokens)",
        )
    _check_pixels(pixels, int(grid.prod(dim=1).sum()), info.image_spec.patch_dim)
    ids = inputs["input_ids"]
    placeholders = int((ids == info.image_spec.token_id).sum())
    if placeholders != tokens:
        raise InvalidInput(
            "image_tokens_mismatch",
            f"input_ids hold {placeholders} image tokens (id {info.image_spec.token_id}); "
            f"image_grid_thw makes {tokens}",
        )
    types = inputs.get("mm_token_type_ids")
    if types is not None and (types.shape != ids.shape or types.dtype not in (torch.int32, torch.int64)):
        raise InvalidInput(
            "bad_images",
            f"mm_token_type_ids must be integers shaped as input_ids {list(ids.shape)}, "
            f"got {types.dtype} {list(types.shape)}",
        )


def _image_tokens(grid: torch.Tensor, merge: int) -> int:
    if grid.dtype != torch.int64 or grid.dim() != 2 or grid.shape[1] != 3 or not 0 < len(grid) <= MAX_IMAGES:
        raise InvalidInput(
            "bad_images", f"image_grid_thw must be int64 [images, 3], got {grid.dtype} {list(grid.shape)}"
        )
    if int(grid.min()) < 1 or int(grid.max()) > MAX_GRID or bool((grid[:, 1:] % merge != 0).any()):
        raise InvalidInput(
            "bad_images",
            f"image_grid_thw rows are (t, h, w) in [1, {MAX_GRID}], h and w multiples of {merge}",
        )
    return int(grid.prod(dim=1).sum()) // merge**2


def _check_pixels(pixels: torch.Tensor, patches: int, patch_dim: int) -> None:
    if not pixels.is_floating_point() or pixels.dim() != 2 or pixels.shape[1] != patch_dim:
        raise InvalidInput(
            "bad_images",
            f"pixel_values must be floating point [patches, {patch_dim}], got {pixels.dtype} {list(pixels.shape)}",
        )
    if pixels.shape[0] != patches:
        raise InvalidInput(
            "image_patches_mismatch",
            f"pixel_values hold {pixels.shape[0]} patches; image_grid_thw makes {patches}",
        )
