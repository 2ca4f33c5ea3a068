"""NeMo AutoModel's own EAGLE-3 trainer on the fleet (nemo-automodel 0.7.0, CPU).

The reference is co-located NeMo training: NeMo's HFEagle3TargetModel runs the same tiny, sharpened Llama
in-process. Training through NeMoTargetBackend (two server processes, prefetch) must give bit-identical
per-step losses and final draft weights; so must NeMo's recipe through our TrainEagle3Recipe and through
`eagle3-target train-draft`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from nemo_automodel.components.speculative.eagle import (
    HFEagle3TargetModel,
)
from nemo_automodel.recipes.llm import train_eagle3 as nemo_recipe
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from eagle3_target.cli import main
from eagle3_target.client import ServerError
from eagle3_target.client.nemo import NeMoTargetBackend, TrainEagle3Recipe

from .eagle3_loop import assert_identical, nemo_batches, train
from .exactness import SEED, CpuAutoModel, load_config, start_fleet
from .nemo_support import build_target, write_chats

TOKEN = "s3cret-trainer-token"


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    root = tmp_path_factory.mktemp("nemo-target")
    return build_target(root / "model"), write_chats(root / "chats.jsonl", 16)


@pytest.fixture(scope="module")
def fleet(target):
    servers = start_fleet(target[0], ["127.0.0.2", "127.0.0.3"])
    yield servers
    for server in servers:
        server.kill()


# -- a NeMo training loop over any Eagle3TargetBackend ---------------------------------------


@pytest.fixture(scope="module")
def data(target):
    return nemo_batches(*target)


@pytest.fixture(scope="module")
def colocated(target, data):
    model = AutoModelForCausalLM.from_pretrained(target[0])
    return train(HFEagle3TargetModel(model), data, target[0], prefetch=False)


@pytest.mark.parametrize("encoding", ["nemo", "logits"])  # NeMo's reply, and our compact exact one
def test_two_servers_with_prefetch_train_bit_identically_to_colocated_nemo(
    encoding, fleet, target, data, colocated
):
    with NeMoTargetBackend([s.url for s in fleet], encoding=encoding) as backend:
        backend.wait_for_servers()
        assert backend.num_remote_servers == 2 and backend.supports_async
        before = [s.generated() for s in fleet]
        got = train(backend, data, target[0], prefetch=True)
    assert all(s.generated() > b for s, b in zip(fleet, before, strict=True)), "both servers must serve"
    assert_identical(got, colocated)


def test_a_server_sigkilled_mid_run_changes_nothing(fleet, target, data, colocated):
    victim = start_fleet(target[0], ["127.0.0.4"])[0]
    try:
        with NeMoTargetBackend([fleet[0].url, victim.url], deadline=120) as backend:
            backend.wait_for_servers()
            assert backend.num_remote_servers == 2

            def kill_after_third_step(step: int) -> None:
                if step == 2:
                    assert victim.generated() > 0, "the victim must have served before it dies"
                    victim.kill()

            got = train(backend, data, target[0], prefetch=True, after_step=kill_after_third_step)
            assert victim.process.returncode == -9
            assert backend.num_remote_servers == 1
    finally:
        victim.kill()
    assert_identical(got, colocated)


def test_token_auth_on_the_servers(tmp_path, target, data, colocated):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    servers = start_fleet(target[0], ["127.0.0.5", "127.0.0.6"], "--auth-token-file", str(token_file))
    try:
        urls = [s.url for s in servers]
        with NeMoTargetBackend(urls, auth_token=TOKEN) as backend:
            backend.wait_for_servers()
            assert backend.num_remote_servers == 2
            got = train(backend, data, target[0], prefetch=True)
        with pytest.raises(ServerError) as refused:
            NeMoTargetBackend(urls, auth_token="wrong", start_timeout=30)
        assert refused.value.status == 401
    finally:
        for server in servers:
            server.kill()
    assert_identical(got, colocated)


# -- NeMo's recipe: TrainEagle3Recipe and `eagle3-target train-draft` -------------------------


def recipe_yaml(out: Path, target, **extra) -> Path:
    model, chats = target
    config = {
        "dist_env": {"backend": "gloo"},
        "recipe_args": {
            "target_model_name_or_path": str(model),
            "train_data_path": str(chats),
            "seq_length": 32,
            "micro_batch_size": 2,
            "ttt_steps": 2,
            "num_epochs": 1,
            "draft_vocab_size": 128,
            "output_dir": str(out),
            "log_every_steps": 4,
        },
        "optimizer": {"lr": 1e-3},
        "checkpoint": {"checkpoint_dir": str(out / "checkpoints")},
    }
    for dotted, value in extra.items():
        section, key = dotted.split("__")
        config.setdefault(section, {})[key] = value
    path = out / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def final_weights(checkpoints: Path) -> dict[str, torch.Tensor]:
    """The consolidated (HF safetensors) draft of the one checkpoint a run wrote."""
    files = list(checkpoints.glob("epoch_*_step_*/model/consolidated/*.safetensors"))
    assert len(files) == 1, files
    return load_file(files[0])


def assert_same_weights(got: dict, reference: dict) -> None:
    assert got.keys() == reference.keys()
    for name, value in reference.items():
        assert torch.equal(got[name], value), name


@pytest.fixture(scope="module")
def colocated_recipe(target, tmp_path_factory):
    out = tmp_path_factory.mktemp("colocated-recipe")
    cfg = load_config(recipe_yaml(out, target))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nemo_recipe, "NeMoAutoModelForCausalLM", CpuAutoModel)
        torch.manual_seed(SEED)  # the caller's seed, as the runs under test get it
        recipe = nemo_recipe.TrainEagle3Recipe(cfg)
        recipe.setup()
        initial = {k: v.clone() for k, v in recipe.draft_model.state_dict().items()}
        recipe.run_train_validation_loop()
    weights = final_weights(out / "checkpoints")
    assert any(not torch.equal(weights[k], initial[k]) for k in weights), "the reference must train"
    return weights


def test_recipe_class_trains_bit_identically_and_writes_a_checkpoint(
    fleet, target, tmp_path, colocated_recipe
):
    endpoints = ",".join(s.url for s in fleet)
    path = recipe_yaml(
        tmp_path, target, recipe_args__target_prefetch_depth=4, remote_target__endpoints=endpoints
    )
    recipe = TrainEagle3Recipe(load_config(path))
    torch.manual_seed(SEED)
    recipe.setup()
    assert recipe.target_prefetch_depth == 2  # both servers joined before NeMo capped the depth
    recipe.run_train_validation_loop()
    assert_same_weights(final_weights(tmp_path / "checkpoints"), colocated_recipe)


def test_train_draft_trains_bit_identically_and_writes_a_checkpoint(
    fleet, target, tmp_path, colocated_recipe, monkeypatch
):
    path = recipe_yaml(tmp_path, target, recipe_args__target_prefetch_depth=2)
    checkpoints = tmp_path / "elsewhere"
    monkeypatch.setenv("EAGLE3_TARGET_SERVICE", ",".join(s.url for s in fleet))
    # The co-located reference trained in this process: the subprocess must use as many intra-op
    # threads, or its reductions run in another order and the weights differ in the last bits.
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))
    done = subprocess.run(
        [sys.executable, "-m", "eagle3_target.cli", "train-draft", "--config", str(path)]
        + [f"--checkpoint.checkpoint_dir={checkpoints}", f"--remote_target.seed={SEED}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (tmp_path / "checkpoints").exists()  # the override, not the YAML, named the directory
    assert_same_weights(final_weights(checkpoints), colocated_recipe)


def test_a_draft_whose_dtype_is_not_the_fleets_is_refused_in_one_line(target, tmp_path, capsys):
    """A CPU draft computes in float32, as NeMo's co-located target would: a bfloat16 fleet stops
    train-draft at setup, before a step."""
    server = start_fleet(target[0], ["127.0.0.7"], "--dtype", "bfloat16")[0]
    try:
        path = recipe_yaml(tmp_path, target, remote_target__endpoints=server.url)
        assert main(["train-draft", "--config", str(path), "--remote_target.wait_timeout=30"]) == 2
    finally:
        server.kill()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("eagle3-target train-draft: error: draft float32, fleet bfloat16: serve the target")
    assert not (tmp_path / "checkpoints").exists()


def initial_draft(recipe) -> dict[str, torch.Tensor]:
    recipe.setup()
    return {k: v.clone() for k, v in recipe.draft_model.state_dict().items()}


def test_the_recipe_keeps_the_callers_seed_unless_given_one(fleet, target, tmp_path):
    """The same caller seed gives the same initial draft as NeMo's own recipe; remote_target.seed, when
    set, seeds torch instead (an explicit option, off by default)."""
    endpoints = ",".join(s.url for s in fleet)

    def nemo_draft(seed: int) -> dict[str, torch.Tensor]:
        out = tmp_path / f"nemo-{seed}"
        out.mkdir()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(nemo_recipe, "NeMoAutoModelForCausalLM", CpuAutoModel)
            torch.manual_seed(seed)
            return initial_draft(nemo_recipe.TrainEagle3Recipe(load_config(recipe_yaml(out, target))))

    def our_draft(caller_seed: int, **extra) -> dict[str, torch.Tensor]:
        out = tmp_path / f"ours-{caller_seed}-{len(extra)}"
        out.mkdir()
        path = recipe_yaml(out, target, remote_target__endpoints=endpoints, **extra)
        recipe = TrainEagle3Recipe(load_config(path))
        torch.manual_seed(caller_seed)
        return initial_draft(recipe)

    caller_seed = 1234  # not recipe_args.shuffle_seed (42), which the recipe used to seed torch with
    reference = nemo_draft(caller_seed)
    assert_same_weights(our_draft(caller_seed), reference)
    assert_same_weights(our_draft(99, remote_target__seed=caller_seed), reference)
    assert any(not torch.equal(v, reference[k]) for k, v in nemo_draft(SEED).items()), "the seed must matter"
