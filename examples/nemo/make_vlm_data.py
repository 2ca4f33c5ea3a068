"""Writes a tiny random Qwen2.5-VL target and text conversations for NeMo's ViSpec recipes, into the current
directory (nothing is downloaded):

    vlm-target/           a Qwen2.5-VL (language model 64 wide with 8 layers, vision tower 2 layers), its input
                          embedding scaled x2 (NeMo refuses an embedding whose norm looks untrained) and its
                          head sharpened; a word-level tokenizer with Qwen's vision tokens, a chat template and
                          an image processor
    conversations.jsonl   text conversations (ViSpec stage 1)

Then (docs/families.md, "Vision-language targets"):

    eagle3-target serve --engine hf --model vlm-target --port 8001 &
    EAGLE3_TARGET_SERVICE=http://127.0.0.1:8001 eagle3-target train-draft --config vispec_stage1.yaml
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from make_data import SPECIAL, TEMPLATE, write_conversations
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

VOCAB = 1000
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]},
)
VISION = dict(
    depth=2,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    out_hidden_size=64,
    fullatt_block_indexes=[1],
    window_size=112,
)


def vocabulary() -> list[str]:
    """Special tokens, plain words, then Qwen's vision tokens at the top ids."""
    words = [f"w{i}" for i in range(VOCAB - len(SPECIAL) - len(VISION_TOKENS))]
    return SPECIAL + words + VISION_TOKENS


def build_tiny_qwen2_5_vl(
    seed: int = 1, sharpen: float = 30.0, embedding_scale: float = 2.0
) -> Qwen2_5_VLForConditionalGeneration:
    ids = {t: i for i, t in enumerate(vocabulary())}
    config = Qwen2_5_VLConfig(
        text_config={**TEXT, "bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"]},
        vision_config=VISION,
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration(config).eval()
    with torch.no_grad():
        # NeMo refuses an input embedding whose norm looks untrained: x2 passes its check
        model.get_input_embeddings().weight.mul_(embedding_scale)
        model.lm_head.weight.mul_(sharpen)  # a random head alone gives near-uniform targets
    return model


def write_tokenizer(path: Path) -> list[str]:
    """A word-level tokenizer with the vision tokens and the chat template; returns the plain words."""
    vocab = vocabulary()
    word_level = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=word_level,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=VISION_TOKENS,
    )
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(path)
    return [t for t in vocab if t.startswith("w")]


def write_target(path: Path, embedding_scale: float = 2.0) -> list[str]:
    build_tiny_qwen2_5_vl(embedding_scale=embedding_scale).save_pretrained(path)
    return write_tokenizer(path)


def main() -> None:
    parser = argparse.ArgumentParser(description="Write a tiny Qwen2.5-VL target and conversations.")
    parser.add_argument("--rows", type=int, default=64, help="conversations to write (default 64)")
    args = parser.parse_args()
    words = write_target(Path("vlm-target"))
    write_conversations(Path("conversations.jsonl"), words, args.rows)
    print(f"wrote vlm-target/ and conversations.jsonl ({args.rows} rows) in {Path.cwd()}")


if __name__ == "__main__":
    main()
