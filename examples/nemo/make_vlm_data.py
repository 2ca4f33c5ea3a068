"""Writes a tiny random Qwen2.5-VL target and text conversations for NeMo's ViSpec recipes, into the current
directory (nothing is downloaded):

    vlm-target/           a Qwen2.5-VL (language model 64 wide with 8 layers, vision tower 2 layers), its input
                          embedding scaled x2 (NeMo refuses an embedding whose norm looks untrained) and its
                          head sharpened; a word-level tokenizer with Qwen's vision tokens, a chat template and
                          the processor's config (images of 56 to 112 px)
    conversations.jsonl   text conversations (ViSpec stage 1)
    images/, image_conversations.jsonl, images.json
                          synthetic PNG images, conversations about them in NeMo's ShareGPT form and the meta
                          file NeMo's make_meta_dataset reads (ViSpec stage 2)

Then (docs/families.md, "Vision-language targets"):

    eagle3-target serve --engine hf --model vlm-target --port 8001 &
    EAGLE3_TARGET_SERVICE=http://127.0.0.1:8001 eagle3-target train-draft --config vispec_stage1.yaml
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
from make_data import SPECIAL, write_conversations
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLImageProcessor,
)

VOCAB = 1000
# make_data.py's template, which also takes a message's content as a list of text and image parts (the form the
# processor and NeMo's image datasets use): an image is its placeholder, which the processor widens to its tokens.
TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} : "
    "{% if m['role'] == 'assistant' %}{% generation %}"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}{{ p['text'] }}"
    "{% endfor %}{% endif %} </s>{% endgeneration %}"
    "{% else %}{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|> {% else %}{{ p['text'] }} "
    "{% endif %}{% endfor %}{% endif %} </s>{% endif %} {% endfor %}"
)
IMAGE_PIXELS = dict(min_pixels=56 * 56, max_pixels=112 * 112)  # 4 to 16 image tokens an image
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


def write_tokenizer(
    path: Path,
    vocab: list[str] | None = None,
    vision_tokens: list[str] = VISION_TOKENS,
    template: str = TEMPLATE,
) -> list[str]:
    """A word-level tokenizer with the vision tokens and the chat template; returns the plain words. Another
    model family's tiny target passes its own vocabulary, vision tokens and template."""
    vocab = vocab or vocabulary()
    word_level = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=word_level,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=vision_tokens,
    )
    tokenizer.chat_template = template
    tokenizer.save_pretrained(path)
    return [t for t in vocab if t.startswith("w")]


def write_processor(path: Path) -> None:
    """The processor's config as Qwen2_5_VLProcessor.save_pretrained writes it. Written as JSON because
    building the processor needs torchvision (its video processor) and this script runs without it."""
    image = json.loads(Qwen2VLImageProcessor(**IMAGE_PIXELS).to_json_string())
    config = {
        "processor_class": "Qwen2_5_VLProcessor",
        "image_processor": image,
        "video_processor": {"video_processor_type": "Qwen2VLVideoProcessor"},
    }
    (path / "processor_config.json").write_text(json.dumps(config, indent=2) + "\n")


def write_target(path: Path, embedding_scale: float = 2.0) -> list[str]:
    build_tiny_qwen2_5_vl(embedding_scale=embedding_scale).save_pretrained(path)
    words = write_tokenizer(path)
    write_processor(path)
    return words


def write_image_conversations(
    root: Path, words: list[str], rows: int, seed: int = 0, text_only: tuple[int, ...] = ()
) -> Path:
    """``rows`` PNG images of random pixels (56 to 112 px a side) under root/images, a conversation about each
    in root/image_conversations.jsonl, and root/images.json, the meta file NeMo's make_meta_dataset reads;
    returns that file. The rows numbered in ``text_only`` keep their words but carry no image."""
    rng = random.Random(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    with open(root / "image_conversations.jsonl", "w", encoding="utf-8") as out:
        for row in range(rows):
            side = rng.choice([56, 84, 112])
            image = root / "images" / f"{row:03d}.png"
            Image.frombytes("RGB", (side, side), rng.randbytes(side * side * 3)).save(image)
            question = " ".join(rng.sample(words, rng.randint(2, 5)))
            first = rng.randrange(len(words) - 8)
            answer = " ".join(words[first + i % 5] for i in range(rng.randint(6, 12)))
            turns = [
                {"role": "user", "content": f"<image> {question}"},
                {"role": "assistant", "content": answer},
            ]
            if row in text_only:
                turns[0]["content"] = question
            images = [] if row in text_only else [str(image.resolve())]
            out.write(json.dumps({"messages": turns, "images": images}) + "\n")
    meta = root / "images.json"
    meta.write_text(json.dumps({"synthetic": {"file_name": "image_conversations.jsonl"}}, indent=2) + "\n")
    return meta


def main() -> None:
    parser = argparse.ArgumentParser(description="Write a tiny Qwen2.5-VL target and conversations.")
    parser.add_argument("--rows", type=int, default=64, help="conversations to write (default 64)")
    args = parser.parse_args()
    words = write_target(Path("vlm-target"))
    write_conversations(Path("conversations.jsonl"), words, args.rows)
    write_image_conversations(Path.cwd(), words, args.rows)
    print(f"wrote vlm-target/, conversations.jsonl and images.json ({args.rows} rows each) in {Path.cwd()}")


if __name__ == "__main__":
    main()
