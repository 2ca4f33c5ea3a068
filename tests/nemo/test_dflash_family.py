"""NeMo AutoModel's DFlash family (DFlash, JetSpec, Domino, DFlash 2) on the fleet, against NeMo's own co-located
recipes: two servers, CPU, float32, a tiny random Qwen3; every micro-batch loss and every saved draft tensor equal,
and the trainer's copy of the target holds no weight file."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

from eagle3_target.cli import main
from eagle3_target.client import RemoteTargetBackend, ServerError
from eagle3_target.client.nemo.prefetch import PrefetchedBatches

from .exactness import (
    SEED,
    Family,
    assert_exact,
    fleet_fixture,
    no_synchronous_capture,
    recipe_yaml,
    references_fixture,
    run_colocated,
    run_losing_a_server,
    run_prefetched,
    run_remote,
    saved_draft,
    start_fleet,
    target_fixture,
    weight_files,
)

DFLASH = "nemo_automodel.recipes.llm.train_dflash"  # where the family's target loader lives
SMALL = dict(
    draft_num_hidden_layers=1, block_size=4, num_anchors=8, mask_token_id=3, attention_backend="sdpa"
)
FAMILIES = {
    f.recipe: f
    for f in (
        Family("TrainDFlashRecipe", DFLASH, SMALL),
        Family("TrainJetSpecRecipe", "nemo_automodel.recipes.llm.train_jetspec", SMALL, loader_module=DFLASH),
        Family(
            "TrainDominoRecipe",
            "nemo_automodel.recipes.llm.train_domino",
            {**SMALL, "emb_dim": 16, "gru_hidden_dim": 32},
            loader_module=DFLASH,
        ),
        Family(
            "TrainDFlash2Recipe",
            "nemo_automodel.recipes.llm.train_dflash2",
            {**SMALL, "selector_rank": 8, "selector_top_k": 4, "conv_group_size": 4},
            loader_module=DFLASH,
        ),
    )
}


target = target_fixture("qwen3")
fleet = fleet_fixture("127.0.0.2", "127.0.0.3")
references = references_fixture(FAMILIES)


@pytest.mark.parametrize("recipe", sorted(FAMILIES))
def test_the_fleet_trains_the_draft_bit_identically_to_nemos_colocated_recipe(
    recipe, target, fleet, references, tmp_path, monkeypatch
):
    ours = run_prefetched(FAMILIES[recipe], target, fleet, tmp_path, monkeypatch)
    assert_exact(ours, references(recipe))


def test_validation_batches_are_prefetched_and_exact_too(target, fleet, tmp_path, monkeypatch):
    family = FAMILIES["TrainDominoRecipe"]
    family = dataclasses.replace(
        family, recipe_args={**family.recipe_args, "val_data_path": str(target.chats)}
    )
    reference = run_colocated(family, target, tmp_path / "nemo")
    monkeypatch.setattr(RemoteTargetBackend, "capture", no_synchronous_capture)
    ours = run_remote(family, target, [s.url for s in fleet], tmp_path / "ours")
    assert len(reference.losses) == 16  # 8 training micro-batches, then 8 validation ones
    assert_exact(ours, reference)


def test_jetspecs_compact_request_trains_as_exactly(target, fleet, references, tmp_path, monkeypatch):
    """remote_target.compact: the post-norm hidden state instead of [B, S, V] logits, the lm_head applied on the
    trainer: on the CPU the same product as the target's, so the same bits."""
    replies = []
    take = PrefetchedBatches.take

    def recorded(self, *args, **kwargs):
        reply = take(self, *args, **kwargs)
        replies.append(sorted(reply))
        return reply

    monkeypatch.setattr(PrefetchedBatches, "take", recorded)
    ours = run_remote(FAMILIES["TrainJetSpecRecipe"], target, [s.url for s in fleet], tmp_path, compact=True)
    assert replies and all(keys == ["final_hidden", "hidden_states"] for keys in replies), replies
    assert_exact(ours, references("TrainJetSpecRecipe"))


def test_a_server_sigkilled_mid_run_changes_nothing(target, fleet, references, tmp_path):
    ours = run_losing_a_server(FAMILIES["TrainJetSpecRecipe"], target, fleet[0], tmp_path)
    assert_exact(ours, references("TrainJetSpecRecipe"))


def test_token_auth_covers_the_weights_and_the_captures(target, references, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-trainer-token\n")
    server = start_fleet(target.model, ["127.0.0.5"], "--auth-token-file", str(token))[0]
    try:
        ours = run_remote(
            FAMILIES["TrainDFlashRecipe"], target, [server.url], tmp_path / "ok", auth_token_file=str(token)
        )
        token.write_text("wrong\n")
        with pytest.raises(ServerError) as refused:
            run_remote(
                FAMILIES["TrainDFlashRecipe"],
                target,
                [server.url],
                tmp_path / "bad",
                auth_token_file=str(token),
                wait_timeout=30,
            )
        assert refused.value.status == 401
    finally:
        server.kill()
    assert_exact(ours, references("TrainDFlashRecipe"))


def test_train_draft_picks_the_recipe_from_the_yaml_and_trains_it_exactly(
    target, fleet, references, tmp_path, monkeypatch
):
    family = FAMILIES["TrainDFlash2Recipe"]
    path = recipe_yaml(
        family, target.config_only, target.chats, tmp_path, recipe=f"{family.nemo_module}.{family.recipe}"
    )
    monkeypatch.setenv("EAGLE3_TARGET_SERVICE", ",".join(s.url for s in fleet))
    # Same intra-op thread count as the reference in this process, or reductions run in another order.
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))
    done = subprocess.run(
        [sys.executable, "-m", "eagle3_target.cli", "train-draft", "--config", str(path)]
        + [f"--remote_target.seed={SEED}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = saved_draft(tmp_path / "checkpoints")
    reference = references("TrainDFlash2Recipe").tensors
    assert got.keys() == reference.keys()
    assert all(torch.equal(got[k], v) for k, v in reference.items())
    assert not weight_files(target.config_only)


def test_a_draft_whose_dtype_is_not_the_fleets_is_refused_in_one_line(target, tmp_path, capsys):
    """A CPU draft computes in float32: against a bfloat16 fleet, train-draft stops at setup, before a step."""
    server = start_fleet(target.model, ["127.0.0.6"], "--dtype", "bfloat16")[0]
    try:
        section = {"endpoints": server.url, "wait_timeout": 30}
        path = recipe_yaml(
            FAMILIES["TrainDFlashRecipe"], target.config_only, target.chats, tmp_path, remote_target=section
        )
        assert main(["train-draft", "--config", str(path), "--recipe=TrainDFlashRecipe"]) == 2
    finally:
        server.kill()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        "eagle3-target train-draft: error: draft float32, fleet bfloat16: serve the target with --dtype float32, "
        "or train where the draft's dtype is bfloat16 (NeMo's recipes compute in bfloat16 on a GPU, float32 on "
        "the CPU)"
    )
    assert not (tmp_path / "checkpoints").exists()
