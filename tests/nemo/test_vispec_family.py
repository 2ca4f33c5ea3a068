"""NeMo AutoModel's ViSpec recipes on the fleet against NeMo's own co-located ones: two servers of a tiny random
Qwen2.5-VL (CPU, float32), every micro-batch loss (float32 bits) and every saved draft tensor equal, both
servers serving, the trainer's copy of the target without weight files.

Stage 1's co-located reference loads its target with transformers' AutoModelForImageTextToText itself: it needs
no CPU shim."""

from __future__ import annotations

import pytest

from .exactness import (
    Family,
    assert_exact,
    fleet_fixture,
    references_fixture,
    run_prefetched,
)
from .vlm_support import vlm_target_fixture

STAGE1 = Family(
    "TrainVispecStage1Recipe",
    "nemo_automodel.recipes.llm.train_vispec",
    loader_module="nemo_automodel.recipes.llm.train_eagle1",  # the recipe loads its VLM itself
)
FAMILIES = {f.recipe: f for f in (STAGE1,)}

target = vlm_target_fixture()
fleet = fleet_fixture("127.0.0.2", "127.0.0.3")
references = references_fixture(FAMILIES)


@pytest.mark.parametrize("compact", [False, True], ids=["exact", "compact"])
def test_vispec_stage1_on_the_fleet_is_bit_identical_to_nemos_colocated_recipe(
    compact, target, fleet, references, tmp_path, monkeypatch
):
    extra = {"compact": True} if compact else {}
    ours = run_prefetched(STAGE1, target, fleet, tmp_path, monkeypatch, **extra)
    assert_exact(ours, references(STAGE1.recipe))
