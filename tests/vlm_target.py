"""examples/nemo/make_vlm_data.py's tiny random Qwen2.5-VL, for any test that serves an image-text target."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from tools import REPO

_EXAMPLES = str(REPO / "examples" / "nemo")


def make_vlm_data():
    """examples/nemo/make_vlm_data.py (which imports its neighbour make_data.py) as a module."""
    if _EXAMPLES not in sys.path:
        sys.path.insert(0, _EXAMPLES)
    return importlib.import_module("make_vlm_data")


def write_vlm_target(path: Path) -> list[str]:
    """The target's weights, tokenizer and chat template in ``path``; returns the tokenizer's plain words."""
    return make_vlm_data().write_target(path)
