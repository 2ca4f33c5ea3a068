"""The tiny random Qwen2.5-VL target of examples/nemo/make_vlm_data.py, as tests/nemo/exactness.py's Target:
the same files a user writes with the example, so the tests train on what the docs show."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from vlm_target import write_vlm_target

from .exactness import Target, config_only_copy
from .nemo_support import make_data


def make_vlm_target(root: Path, chats: int = 16, embedding_scale: float = 2.0) -> Target:
    words = write_vlm_target(root / "model", embedding_scale)
    make_data.write_conversations(root / "chats.jsonl", words, chats, seed=3)
    return Target(root / "model", root / "chats.jsonl", config_only_copy(root / "model", root / "trainer"))


def vlm_target_fixture():
    @pytest.fixture(scope="module", name="target")
    def target(tmp_path_factory) -> Target:
        return make_vlm_target(tmp_path_factory.mktemp("qwen2_5_vl"))

    return target


def require_image_pipeline() -> None:
    """NeMo's image pipeline needs the vlm extra: skip without it, and fail where it must be installed (CI)."""
    missing = [m for m in ("torchvision", "qwen_vl_utils") if importlib.util.find_spec(m) is None]
    if missing:
        message = f"{' and '.join(missing)} not installed (pip install '.[vlm]', docs/families.md)"
        if os.environ.get("EAGLE3_TARGET_VLM_INSTALL") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
