"""ViSpec stage 2 whole: NeMo's co-located TrainVispecRecipe and ours against two servers of a tiny random
Qwen2.5-VL (CPU, float32), on synthetic PNG images through NeMo's own image pipeline, seeded before setup():
every micro-batch loss (float32 bits) and every saved draft tensor equal, both servers serving, the trainer's copy
of the target holding the processor's config but no weights.

NeMo's image pipeline needs qwen-vl-utils and torchvision, which imports on a CPU only in the `vlm` extra's
install (docs/families.md): .ci/extras runs this file in that venv, where a skip is a failure
(EAGLE3_TARGET_VLM_INSTALL=1). The README's test environment has no torchvision; there it skips."""

from __future__ import annotations

import pytest
import torch
from vlm_target import make_vlm_data

from .exactness import (
    Family,
    assert_exact,
    fleet_fixture,
    load_config,
    recipe_yaml,
    train_closing,
    weight_files,
)
from .vlm_support import require_image_pipeline, vlm_target_fixture

STAGE2 = Family(
    "TrainVispecRecipe",
    "nemo_automodel.recipes.llm.train_vispec",
    recipe_args={"seq_length": 64, "micro_batch_size": 1, "train_data_path": None},
)
IMAGES = 4  # NeMo trains ViSpec on micro-batches of one: four steps

target = vlm_target_fixture()
fleet = fleet_fixture("127.0.0.2", "127.0.0.3")


@pytest.fixture(scope="module")
def dataset(target, tmp_path_factory):
    """NeMo's make_meta_dataset over the example's synthetic images, as the recipe's `dataset:` section."""
    require_image_pipeline()
    vlm = make_vlm_data()
    words = [w for w in vlm.vocabulary() if w.startswith("w")]
    meta = vlm.write_image_conversations(tmp_path_factory.mktemp("images"), words, IMAGES, seed=5)
    return {
        "_target_": "nemo_automodel.components.datasets.vlm.datasets.make_meta_dataset",
        "path_or_dataset": str(meta),
    }


def run(target_path, target, out, dataset, **sections):
    path = recipe_yaml(STAGE2, target_path, target.chats, out, dataset=dataset, **sections)
    recipe = STAGE2.our_class()(load_config(path)) if sections else STAGE2.nemo_class()(load_config(path))
    return train_closing(recipe, STAGE2, out / "checkpoints")


@pytest.mark.skip_ok_in_ci  # .ci/extras runs it where torchvision imports (module docstring)
@pytest.mark.parametrize("compact", [False, True], ids=["exact", "compact"])
def test_vispec_stage2_on_the_fleet_is_bit_identical_to_nemos_colocated_recipe(
    compact, target, fleet, dataset, tmp_path
):
    reference = run(target.model, target, tmp_path / "nemo", dataset)
    before = [s.generated() for s in fleet]
    section = {"endpoints": ",".join(s.url for s in fleet), "wait_timeout": 60, "compact": compact}
    ours = run(target.config_only, target, tmp_path / "ours", dataset, remote_target=section)
    assert torch.isfinite(reference.losses).all()
    assert_exact(ours, reference)
    assert all(s.generated() > b for s, b in zip(fleet, before, strict=True)), "every server must serve"
    assert not weight_files(target.config_only), "the trainer must not need the target's weights"
    assert (target.config_only / "processor_config.json").is_file()


@pytest.mark.skip_ok_in_ci  # as above
def test_the_trainers_copy_of_the_target_makes_nemos_image_batches(target, dataset):
    """The processor loads from the trainer's weightless copy, and NeMo's collate makes batches that carry
    images: pixel_values in bfloat16, image tokens in input_ids and assistant tokens to learn."""
    from nemo_automodel.components.datasets.vlm.datasets import make_meta_dataset
    from nemo_automodel.components.datasets.vlm.dspark_collate import dspark_vlm_collate_fn
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(target.config_only)
    examples = make_meta_dataset(dataset["path_or_dataset"])
    batch = dspark_vlm_collate_fn(examples[:1], processor, max_length=64, inject_fake_image=False)
    image_tokens = int((batch["input_ids"] == processor.image_token_id).sum())
    assert (
        batch["pixel_values"].dtype == torch.bfloat16 and image_tokens == batch["image_grid_thw"].prod() // 4
    )
    assert batch["loss_mask"].sum() > 0
    assert not weight_files(target.config_only)
