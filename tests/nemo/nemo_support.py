"""A tiny, sharpened Llama target with a tokenizer and chat data: what NeMo's EAGLE-3 recipe trains on."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from eagle3_target.server.runners.tiny import TINY_LLAMA, build_tiny_llama

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "user", "assistant", ":"]
WORDS = [f"w{i}" for i in range(TINY_LLAMA["vocab_size"] - len(SPECIALS))]
CHAT_TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} : "
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }} </s>{% endgeneration %}"
    "{% else %}{{ m['content'] }} </s>{% endif %} {% endfor %}"
)
SHARPEN = 30.0  # a random lm_head gives near-uniform probabilities and a flat loss


def build_target(path: Path) -> Path:
    """save_pretrained of the tiny Llama (lm_head x30) and a word-level tokenizer with a chat template."""
    model = build_tiny_llama(seed=1)
    with torch.no_grad():
        model.lm_head.weight.mul_(SHARPEN)
    model.save_pretrained(path)
    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return path


def write_chats(path: Path, count: int, seed: int = 3) -> Path:
    """Two-turn conversations whose answers repeat a per-row pattern, so a draft can learn something."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(count):
            start = rng.randrange(len(WORDS) - 40)
            prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(4, 10)))
            answer = " ".join(WORDS[start + (i % 7)] for i in range(rng.randrange(10, 20)))
            messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
            f.write(json.dumps({"messages": messages}) + "\n")
    return path
