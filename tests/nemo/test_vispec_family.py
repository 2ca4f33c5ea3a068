"""NeMo AutoModel's ViSpec recipes on the fleet against NeMo's own co-located ones: two servers of a tiny random
Qwen2.5-VL (CPU, float32), every micro-batch loss (float32 bits) and every saved draft tensor equal, both
servers serving, the trainer's copy of the target without weight files.

Stage 1's co-located reference loads its target with transformers' AutoModelForImageTextToText itself: it needs
no CPU shim. Stage 2 is checked batch by batch here: the VispecTargetBatch our wrapper builds from the fleet
against NeMo's HFVispecTargetModel on the same image-text batches (a whole stage-2 run needs NeMo's image data
pipeline, which does not import on this CPU: docs/families.md)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from nemo_automodel.components.speculative.eagle.vispec_target import HFVispecTargetModel
from transformers import AutoModelForImageTextToText
from vlm_target import image_batch

import eagle3_target.client.nemo as ours_module
from eagle3_target.client.nemo.fleet_target import open_backend
from eagle3_target.client.nemo.prefetch import PrefetchingLoader
from eagle3_target.client.nemo.registry import by_recipe
from eagle3_target.client.nemo.remote import RemoteTargetSettings
from eagle3_target.client.nemo.vispec import RemoteVispecTarget

from .exactness import (
    SEED,
    Family,
    assert_exact,
    fleet_fixture,
    recipe_yaml,
    references_fixture,
    run_prefetched,
    run_remote,
    saved_draft,
    start_fleet,
    weight_files,
)
from .vlm_support import make_vlm_target, vlm_target_fixture

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


@pytest.mark.parametrize("compact", [False, True], ids=["exact", "compact"])
def test_vispec_stage2_batches_from_the_fleet_are_nemos_bit_for_bit(compact, target, fleet):
    model = AutoModelForImageTextToText.from_pretrained(target.model, dtype=torch.float32)
    nemo = HFVispecTargetModel(model, image_token_id=model.config.image_token_id)
    section = {"endpoints": ",".join(s.url for s in fleet), "wait_timeout": 60, "compact": compact}
    settings = RemoteTargetSettings.parse(section)
    backend, weights = open_backend(by_recipe("TrainVispecRecipe").request, torch.device("cpu"), settings)
    ours = RemoteVispecTarget(backend, weights, torch.device("cpu"), settings)
    before = [s.generated() for s in fleet]
    batches = [image_batch(model, images_per_row=1 + i % 2, seed=i) for i in range(6)]
    try:
        for batch in PrefetchingLoader(batches, ours.prefetched):  # submitted ahead, with their images
            want, got = nemo.generate_batch(**batch), ours.generate_batch(**batch)
            for field in dataclasses.fields(want):
                expected, value = getattr(want, field.name), getattr(got, field.name)
                assert value.dtype == expected.dtype and torch.equal(value, expected), field.name
    finally:
        ours.close()
    assert all(s.generated() > b for s, b in zip(fleet, before, strict=True)), "every server must serve"


def test_both_vispec_recipes_are_exported_as_subclasses_of_nemos_own():
    from nemo_automodel.recipes.llm import train_vispec

    for name in ("TrainVispecStage1Recipe", "TrainVispecRecipe"):
        assert name in ours_module.__all__ and issubclass(
            getattr(ours_module, name), getattr(train_vispec, name)
        )


def test_train_draft_picks_vispec_stage1_from_the_yaml_and_trains_it_exactly(
    target, fleet, references, tmp_path, monkeypatch
):
    path = recipe_yaml(STAGE1, target.config_only, target.chats, tmp_path, recipe=STAGE1.recipe)
    monkeypatch.setenv("EAGLE3_TARGET_SERVICE", ",".join(s.url for s in fleet))
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))  # the reference's reduction order
    done = subprocess.run(
        [sys.executable, "-m", "eagle3_target.cli", "train-draft", "--config", str(path)]
        + [f"--remote_target.seed={SEED}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got, reference = saved_draft(tmp_path / "checkpoints"), references(STAGE1.recipe).tensors
    assert got.keys() == reference.keys() and all(torch.equal(got[k], v) for k, v in reference.items())
    assert not weight_files(target.config_only)


def test_nemos_untrained_target_check_runs_on_the_embedding_the_fleet_hands_out(tmp_path):
    untrained = make_vlm_target(tmp_path / "target", embedding_scale=1.0)  # a random init's norm
    server = start_fleet(untrained.model, ["127.0.0.4"])[0]
    try:
        with pytest.raises(RuntimeError, match="untrained"):
            run_remote(STAGE1, untrained, [server.url], tmp_path / "ours")
    finally:
        server.kill()


def test_the_trainers_copy_of_the_target_holds_the_processor_config_but_no_weights(target):
    """What NeMo's stage 2 loads with AutoProcessor (tests/nemo/test_vispec_stage2_run.py loads it where
    torchvision imports): the image processor's settings travel with the config and tokenizer."""
    config = json.loads((target.config_only / "processor_config.json").read_text())
    assert config["processor_class"] == "Qwen2_5_VLProcessor"
    assert config["image_processor"]["patch_size"] == 14 and config["image_processor"]["merge_size"] == 2
    assert {"config.json", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in target.config_only.iterdir()
    }
    assert not weight_files(target.config_only)
