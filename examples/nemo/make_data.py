"""Writes what examples/nemo/recipe.yaml trains on, into the current directory (nothing is downloaded):

    target/               a tiny random Llama (the server's embedded one, its head sharpened so the target's
                          distributions are peaked; with --architecture qwen3 a Qwen3 of the same shape, for
                          examples/nemo/dflash.yaml) with a word-level tokenizer and a chat template
    conversations.jsonl   OpenAI-style `messages` rows whose answers follow a pattern a draft can learn

Then, from the same directory (docs/nemo.md):

    eagle3-target serve --model target --host 127.0.0.1 --port 8001 &
    EAGLE3_TARGET_SERVICE=http://127.0.0.1:8001 eagle3-target train-draft --config recipe.yaml
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from eagle3_target.server.runners.tiny import (
    TINY_LLAMA,
    TINY_SPECIAL,
    build_tiny_llama,
    build_tiny_tokenizer,
    tiny_words,
)

SPECIAL = TINY_SPECIAL  # the embedded target's tokenizer (server/runners/tiny.py)


def write_target(path: Path, sharpen: float = 30.0, architecture: str = "llama") -> list[str]:
    """The tiny target: the embedded Llama, or a Qwen3 of the same shape (what NeMo's DFlash recipes take)."""
    model = build_tiny_llama(seed=1) if architecture == "llama" else build_tiny_qwen3(seed=1)
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)  # a random head alone gives near-uniform targets
    model.save_pretrained(path)
    return write_tokenizer(path)


def build_tiny_qwen3(seed: int) -> Qwen3ForCausalLM:
    shape = {k: v for k, v in TINY_LLAMA.items() if k != "max_position_embeddings"}
    config = Qwen3Config(**shape, head_dim=16, max_position_embeddings=4096)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen3ForCausalLM(config).eval()


def write_tokenizer(path: Path) -> list[str]:
    """The embedded target's word-level tokenizer with its chat template, beside the config; returns its words."""
    build_tiny_tokenizer().save_pretrained(path)
    return tiny_words()


def write_conversations(path: Path, words: list[str], rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as out:
        for _ in range(rows):
            question = " ".join(rng.sample(words, rng.randint(3, 8)))
            first = rng.randrange(len(words) - 8)
            answer = " ".join(words[first + i % 5] for i in range(rng.randint(8, 16)))  # a repeating run
            turns = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            out.write(json.dumps({"messages": turns}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description="Write the NeMo example's tiny target and conversations.")
    parser.add_argument("--rows", type=int, default=64, help="conversations to write (default 64)")
    parser.add_argument(
        "--architecture",
        choices=["llama", "qwen3"],
        default="llama",
        help="the target's architecture: llama (EAGLE-3) or qwen3 (the DFlash family; default llama)",
    )
    args = parser.parse_args()
    words = write_target(Path("target"), architecture=args.architecture)
    write_conversations(Path("conversations.jsonl"), words, args.rows)
    print(f"wrote target/ and conversations.jsonl ({args.rows} rows) in {Path.cwd()}")


if __name__ == "__main__":
    main()
