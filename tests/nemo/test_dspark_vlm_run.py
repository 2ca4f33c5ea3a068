"""NeMo's multimodal DSpark (TrainDSparkRecipe, recipe_args.multimodal: true) whole: NeMo's co-located recipe and
ours against two servers of a tiny random MiniMax M3 VL (CPU, float32), on synthetic PNG images through NeMo's own
image pipeline, seeded before setup(): every micro-batch loss (float32 bits) and every saved draft tensor equal,
both servers serving, every batch's request submitted ahead by the prefetching loader, the trainer's copy of the
target holding the processor's config but no weights.

The co-located reference needs CPU shims, here only: NeMo loads a MiniMax M3 target with its expert-parallel
builder (NeMoAutoModelForImageTextToText on a device mesh), replaced by transformers' own class with SDPA and no
mesh; the draft trains with flex attention, switched to SDPA after setup() in both runs (as for text DSpark).
Like ViSpec stage 2, it needs torchvision (the `vlm` extra's install): .ci/extras runs it in that venv, where a
skip is a failure (EAGLE3_TARGET_VLM_INSTALL=1)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from vlm_target import make_vlm_data

from eagle3_target import cli
from eagle3_target.client import RemoteTargetBackend

from .exactness import (
    Family,
    assert_exact,
    load_config,
    no_synchronous_capture,
    recipe_yaml,
    start_fleet,
    train,
    train_closing,
    weight_files,
)
from .minimax_vlm import LAYERS, make_minimax_target
from .test_dspark_family import sdpa_draft
from .vlm_support import require_image_pipeline

DSPARK_VLM = Family(
    "TrainDSparkRecipe",
    "nemo_automodel.recipes.llm.train_dspark",
    dict(
        multimodal=True,
        seq_length=64,
        draft_num_hidden_layers=LAYERS,  # NeMo's MiniMax M3 draft keeps the target's per-layer types
        target_layer_ids=[
            -1,
            1,
            3,
        ],  # -1: the token embedding before the images are merged in, on the trainer
        block_size=4,
        num_anchors=8,
        mask_token_id=3,
        markov_rank=16,
    ),
    after_setup=sdpa_draft,
)
IMAGES = 8  # micro-batches of two: four steps


class CpuImageTextModel:
    """NeMo's MiniMax M3 builder shards the target over a device mesh; on CPU, transformers' class with SDPA."""

    @staticmethod
    def from_pretrained(path, torch_dtype=torch.float32, trust_remote_code=False, **_):
        from transformers import MiniMaxM3SparseForConditionalGeneration

        return MiniMaxM3SparseForConditionalGeneration.from_pretrained(
            path, dtype=torch_dtype, attn_implementation="sdpa"
        )


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_minimax_target(tmp_path_factory.mktemp("minimax_m3_vl"))


@pytest.fixture(scope="module")
def fleet(target):
    """Two servers; four layers have no three distinct default aux layers, which DSpark does not use anyway."""
    servers = start_fleet(target.model, ["127.0.0.2", "127.0.0.3"], "--aux-layer-ids", "0,1,2")
    yield servers
    for server in servers:
        server.kill()


@pytest.fixture(scope="module")
def dataset(target, tmp_path_factory):
    """NeMo's make_meta_dataset over synthetic images, as the recipe's `dataset:` section."""
    require_image_pipeline()
    words = [f"w{i}" for i in range(900)]
    # two conversations without an image: NeMo's collate gives each a masked fake image, which the fleet serves too
    meta = make_vlm_data().write_image_conversations(
        tmp_path_factory.mktemp("images"), words, IMAGES, seed=5, text_only=(1, 6)
    )
    return {
        "_target_": "nemo_automodel.components.datasets.vlm.datasets.make_meta_dataset",
        "path_or_dataset": str(meta),
    }


def run_colocated(target, out, dataset):
    path = recipe_yaml(DSPARK_VLM, target.model, target.chats, out, dataset=dataset)
    nemo = importlib.import_module(DSPARK_VLM.nemo_module)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nemo, "NeMoAutoModelForImageTextToText", CpuImageTextModel)
        mp.setattr(nemo, "create_distributed_setup_from_config", lambda *_a, **_k: None)
        return train(DSPARK_VLM.nemo_class()(load_config(path)), DSPARK_VLM, out / "checkpoints")


def run_remote(target, fleet, out, dataset):
    section = {"endpoints": ",".join(s.url for s in fleet), "wait_timeout": 60}
    path = recipe_yaml(
        DSPARK_VLM, target.config_only, target.chats, out, dataset=dataset, remote_target=section
    )
    recipe = DSPARK_VLM.our_class()(load_config(path))
    return train_closing(recipe, DSPARK_VLM, out / "checkpoints")


@pytest.mark.skip_ok_in_ci  # .ci/extras runs it where torchvision imports (module docstring)
def test_multimodal_dspark_on_the_fleet_is_bit_identical_to_nemos_colocated_recipe(
    target, fleet, dataset, tmp_path, monkeypatch
):
    reference = run_colocated(target, tmp_path / "nemo", dataset)
    before = [s.generated() for s in fleet]
    monkeypatch.setattr(RemoteTargetBackend, "capture", no_synchronous_capture)  # every batch prefetched
    ours = run_remote(target, fleet, tmp_path / "ours", dataset)
    assert torch.isfinite(reference.losses).all()
    assert len(reference.losses) == IMAGES // 2
    assert_exact(ours, reference)
    assert all(s.generated() > b for s, b in zip(fleet, before, strict=True)), "every server must serve"
    assert not weight_files(target.config_only), "the trainer must not need the target's weights"
    assert (target.config_only / "processor_config.json").is_file()


@pytest.mark.parametrize(
    ("recipe_args", "message"),
    [
        ({"multimodal": False}, "MiniMax M3 VL with recipe_args.multimodal: true"),
        ({"target_num_hidden_layers": 2}, "the fleet serves the whole checkpoint"),
    ],
    ids=["text-only", "fewer-target-layers"],
)
def test_what_the_fleet_does_not_serve_of_a_minimax_target_is_refused_in_one_line(
    target, tmp_path, recipe_args, message
):
    family = Family(DSPARK_VLM.recipe, DSPARK_VLM.nemo_module, {**DSPARK_VLM.recipe_args, **recipe_args})
    section = {"endpoints": "http://h:1"}
    path = recipe_yaml(family, target.config_only, target.chats, tmp_path, remote_target=section)
    with pytest.raises(ValueError, match=message):
        DSPARK_VLM.our_class()(load_config(path))


def test_precompute_refuses_a_minimax_target_in_one_line(target, tmp_path, capsys):
    """NeMo 0.7.0's DSpark cache is text-only and its precompute refuses MiniMax M3 VL: so does ours."""
    argv = ["precompute", "--family", "dspark", "--endpoints", "http://127.0.0.1:9"]
    argv += ["--target-model", str(target.config_only), "--input-data", str(target.chats)]
    assert cli.main([*argv, "--output-dir", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err.strip()
    assert "has no offline cache in NeMo 0.7.0" in err and len(err.splitlines()) == 1
