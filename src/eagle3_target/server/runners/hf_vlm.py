"""Image-text checkpoints in the hf engine (Qwen2.5-VL and the like): which loader class a checkpoint
takes, and what its /model_info says it accepts.

transformers' AutoModelForCausalLM refuses an image-text config (``Qwen2_5_VLConfig``); such a checkpoint
loads with AutoModelForImageTextToText, as NeMo's ViSpec recipes load their target. Its language model is
then the hf runner's decoder (``model.language_model.layers``) and its lm_head the runner's head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

IMAGE_TEXT_MODALITIES = ("text", "image")
_IMAGE_TEXT_AUTO = "AutoModelForImageTextToText"
_CAUSAL_AUTO = "AutoModelForCausalLM"


def is_image_text(config: Any) -> bool:
    """Whether a config is one AutoModelForCausalLM refuses and AutoModelForImageTextToText takes."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    auto_map = getattr(config, "auto_map", None) or {}
    if _CAUSAL_AUTO in auto_map:  # remote code that names its own causal LM class
        return False
    if _IMAGE_TEXT_AUTO in auto_map:
        return True
    model_type = getattr(config, "model_type", None)
    return (
        model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
        and model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    )


def read_config(model: str, trust_remote_code: bool):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)


def load_pretrained(model: str, dtype, trust_remote_code: bool) -> nn.Module:
    """The checkpoint with the auto class its config takes: image-text or causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    config = read_config(model, trust_remote_code)
    auto = AutoModelForImageTextToText if is_image_text(config) else AutoModelForCausalLM
    return auto.from_pretrained(model, dtype=dtype, trust_remote_code=trust_remote_code)


def modalities(model: nn.Module) -> tuple[str, ...]:
    """What /model_info lists: text and image for an image-text model, nothing (text only) otherwise."""
    return IMAGE_TEXT_MODALITIES if is_image_text(model.config) else ()


@dataclass(frozen=True)
class ImageSpec:
    """What an image-text target's image inputs must look like (Qwen2-VL's processor layout):
    pixel_values [patches, patch_dim], each image's grid (t, h, w) in patches, one ``token_id`` in
    input_ids per ``merge``² patches."""

    token_id: int
    merge: int
    patch_dim: int


def image_spec(config: Any) -> ImageSpec | None:
    """The spec from the model's config; None where it is not an image-text model of that layout."""
    vision = getattr(config, "vision_config", None)
    token_id = getattr(config, "image_token_id", None)
    if not is_image_text(config) or vision is None or token_id is None:
        return None
    channels = getattr(vision, "in_channels", None) or vision.num_channels  # Qwen2-VL's name, MiniMax M3's
    patch_dim = channels * vision.temporal_patch_size * vision.patch_size**2
    return ImageSpec(int(token_id), int(vision.spatial_merge_size), int(patch_dim))


def embedding_output_point(model: nn.Module, hook):
    """Hook ``hook(module, args, output)`` where HF's ``hidden_states[0]`` is made: the input embedding's
    output for a causal LM; for an image-text model the language model's ``inputs_embeds``, the token
    embeddings with the image features merged in. Returns the hook's handle."""
    if not is_image_text(model.config):
        return model.get_input_embeddings().register_forward_hook(hook)
    language_model = model.get_decoder()

    def before(module, _args, kwargs):
        hook(module, (), kwargs["inputs_embeds"])

    return language_model.register_forward_pre_hook(before, with_kwargs=True)
