"""The cache `eagle3-target precompute` writes from a real server equals, file for file, the one NeMo
0.7.0's own precompute_eagle3 writes in-process for the same model, data and flags (CPU, float32); and
NeMo's recipe trains from it exactly as from NeMo's cache."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import yaml
from nemo_automodel.components.config._arg_parser import parse_args_and_load_config
from nemo_automodel.recipes.llm import train_eagle3 as nemo_recipe

from .precompute_support import (
    argv,
    cache_files,
    cache_tensors,
    cache_version,
    nemo_precompute,
    precompute,
    served_version,
)

TOPK = 16  # below the draft vocabulary (128), so NeMo stores the top-k factorization


@pytest.fixture(scope="module")
def nemo_caches(target, tmp_path_factory):
    """NeMo's caches, without and with --target-probs-topk."""
    root = tmp_path_factory.mktemp("nemo-cache")
    with pytest.MonkeyPatch.context() as mp:
        full = nemo_precompute(mp, root / "full", *target)
        topk = nemo_precompute(mp, root / "topk", *target, "--target-probs-topk", str(TOPK))
    return {0: full, TOPK: topk}


@pytest.mark.parametrize(("encoding", "topk"), [("nemo", 0), ("logits", 0), ("nemo", TOPK), ("logits", TOPK)])
def test_the_cache_equals_nemos_file_for_file(encoding, topk, hf_server, target, nemo_caches, tmp_path):
    extra = ["--encoding", encoding, "--target-probs-topk", str(topk)]
    assert precompute(*argv(hf_server.url, tmp_path, *target, *extra)) == 0
    reference = nemo_caches[topk]
    ours, theirs = cache_files(tmp_path), cache_files(reference)
    assert (
        ours.keys()
        == theirs.keys()
        == {
            "manifest.json",
            "target_embeddings.safetensors",
            *(f"shard-{i:06d}.safetensors" for i in range(3)),
        }
    )
    assert json.loads(ours["manifest.json"]) == json.loads(theirs["manifest.json"])
    got, want = cache_tensors(tmp_path), cache_tensors(reference)
    assert ("target_probs_values" in want["shard-000000.safetensors"]) == (topk > 0)
    for name, tensors in want.items():
        assert got[name].keys() == tensors.keys(), name
        for key, value in tensors.items():
            assert got[name][key].dtype == value.dtype and torch.equal(got[name][key], value), (name, key)
    assert ours == theirs  # and byte for byte
    assert cache_version(tmp_path) == served_version(hf_server.url)  # recorded beside NeMo's files


def test_hidden_is_refused_unless_asked_for_then_approximate(
    hf_server, target, nemo_caches, tmp_path, capsys, caplog
):
    args = argv(hf_server.url, tmp_path / "refused", *target, "--encoding", "hidden")
    assert precompute(*args) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error == [
        "eagle3-target precompute: error: --encoding hidden gives approximate target_probs, not NeMo's; "
        "add --allow-approximate to accept that"
    ]
    assert not (tmp_path / "refused").exists()
    with caplog.at_level(logging.WARNING):
        args = argv(
            hf_server.url, tmp_path / "hidden", *target, "--encoding", "hidden", "--allow-approximate"
        )
        assert precompute(*args) == 0
    assert "target_probs are approximate" in caplog.text
    got, want = cache_tensors(tmp_path / "hidden"), cache_tensors(nemo_caches[0])
    for name, tensors in want.items():
        for key, value in tensors.items():
            if key == "target_probs":
                torch.testing.assert_close(got[name][key], value, rtol=0, atol=1e-3)
            else:
                assert torch.equal(got[name][key], value), (name, key)


# -- NeMo's recipe on the cache ----------------------------------------------------------------


def train_from_cache(cache, target, out) -> tuple[list[float], dict[str, torch.Tensor]]:
    """NeMo's unchanged recipe on ``cached_target_path``: per-step losses and final draft weights."""
    config = {
        "dist_env": {"backend": "gloo"},
        "recipe_args": {
            "target_model_name_or_path": str(target[0]),
            "train_data_path": str(target[1]),
            "cached_target_path": str(cache),
            "seq_length": 32,
            "micro_batch_size": 2,
            "ttt_steps": 2,
            "num_epochs": 2,
            "draft_vocab_size": 128,
            "output_dir": str(out),
            "log_every_steps": 1,
        },
        "optimizer": {"lr": 1e-3},
    }
    path = out / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    torch.manual_seed(42)  # the caller's seed: the draft's initial weights and the cache's shuffle
    recipe = nemo_recipe.TrainEagle3Recipe(parse_args_and_load_config(argv=["--config", str(path)]))
    recipe.setup()
    losses: list[float] = []
    recipe._wandb_log = lambda data, step: losses.append(data["train/loss"])
    recipe.run_train_validation_loop()
    return losses, {k: v.detach().clone() for k, v in recipe.draft_model.state_dict().items()}


def test_nemos_recipe_trains_from_our_cache_as_from_nemos(hf_server, target, nemo_caches, tmp_path):
    assert precompute(*argv(hf_server.url, tmp_path / "cache", *target)) == 0
    (tmp_path / "ours").mkdir()
    (tmp_path / "theirs").mkdir()
    ours = train_from_cache(tmp_path / "cache", target, tmp_path / "ours")
    theirs = train_from_cache(nemo_caches[0], target, tmp_path / "theirs")
    assert len(theirs[0]) == 12 and theirs[0][-1] < theirs[0][0], theirs[0]  # 6 steps x 2 epochs, learning
    assert ours[0] == theirs[0]
    assert ours[1].keys() == theirs[1].keys()
    for name, value in theirs[1].items():
        assert torch.equal(ours[1][name], value), name
