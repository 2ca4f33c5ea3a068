"""The tiny, sharpened Llama target with a tokenizer and chat data that NeMo's EAGLE-3 recipe trains on: the
same files examples/nemo/make_data.py writes for a user, so the tests train on what the example shows."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tools import REPO

_spec = importlib.util.spec_from_file_location(
    "nemo_example_data", REPO / "examples" / "nemo" / "make_data.py"
)
make_data = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_data)


def build_target(path: Path) -> Path:
    """save_pretrained of the tiny Llama (lm_head sharpened) and a word-level tokenizer with a chat template."""
    make_data.write_target(path)
    return path


def write_chats(path: Path, count: int, seed: int = 3) -> Path:
    """Two-turn conversations whose answers repeat a per-row pattern, so a draft can learn something."""
    words = [f"w{i}" for i in range(make_data.TINY_LLAMA["vocab_size"] - len(make_data.SPECIAL))]
    make_data.write_conversations(path, words, count, seed)
    return path
