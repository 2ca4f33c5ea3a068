"""A tiny random MiniMax M3 VL target (transformers' MiniMaxM3SparseForConditionalGeneration: a language model
64 wide with 4 dense layers, a one-layer vision tower), its word-level tokenizer with MiniMax's vision tokens,
chat template and processor config, for NeMo's multimodal DSpark (TrainDSparkRecipe, recipe_args.multimodal).

NeMo's MiniMax M3 draft builder asserts ``text_config.model_type == "minimax_m3"`` (the released checkpoint's
remote-code name); transformers' own class loads that config as well, so the written config.json says so."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import MiniMaxM3SparseForConditionalGeneration, MiniMaxM3VLConfig
from vlm_target import make_vlm_data

from .exactness import Target, config_only_copy
from .nemo_support import make_data

VOCAB = 1000
IMAGE, VIDEO, START, END = "]<]image[>[", "]<]video[>[", "]<]start of image[>[", "]<]end of image[>["
VISION_TOKENS = [START, END, IMAGE, VIDEO]
LAYERS = 4
TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=64,
    dense_intermediate_size=128,
    shared_intermediate_size=64,
    num_hidden_layers=LAYERS,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rotary_dim=8,
    num_local_experts=2,
    num_experts_per_tok=1,
    mlp_layer_types=["dense"] * LAYERS,
    layer_types=["full_attention"] * LAYERS,
    max_position_embeddings=4096,
)
VISION = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=112
)
# make_vlm_data.py's template with MiniMax's image placeholder, which the processor widens to its tokens
TEMPLATE = make_vlm_data().TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>", IMAGE)


def vocabulary() -> list[str]:
    special = make_data.SPECIAL
    return special + [f"w{i}" for i in range(VOCAB - len(special) - len(VISION_TOKENS))] + VISION_TOKENS


def build(seed: int = 1, sharpen: float = 30.0) -> MiniMaxM3SparseForConditionalGeneration:
    ids = {t: i for i, t in enumerate(vocabulary())}
    config = MiniMaxM3VLConfig(
        text_config={**TEXT, "bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"]},
        vision_config=VISION,
        image_token_index=ids[IMAGE],
        video_token_index=ids[VIDEO],
        projector_hidden_size=64,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MiniMaxM3SparseForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)  # a random head alone gives near-uniform targets
    return model


def write_tokenizer(path: Path) -> list[str]:
    return make_vlm_data().write_tokenizer(path, vocabulary(), VISION_TOKENS, TEMPLATE)


def write_minimax_target(path: Path) -> list[str]:
    build().save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config["text_config"]["model_type"] = "minimax_m3"
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    processor = {
        "processor_class": "MiniMaxM3VLProcessor",
        "image_processor": {
            "image_processor_type": "MiniMaxM3VLImageProcessor",
            "min_pixels": 56 * 56,
            "max_pixels": 112 * 112,
        },
        "video_processor": {"video_processor_type": "MiniMaxM3VLVideoProcessor"},
    }
    (path / "processor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    return write_tokenizer(path)


def make_minimax_target(root: Path, chats: int = 16) -> Target:
    words = write_minimax_target(root / "model")
    make_data.write_conversations(root / "chats.jsonl", words, chats, seed=3)
    return Target(root / "model", root / "chats.jsonl", config_only_copy(root / "model", root / "trainer"))
