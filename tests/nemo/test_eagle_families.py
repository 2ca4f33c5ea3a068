"""NeMo AutoModel's P-EAGLE (TrainEagle3Recipe, parallel_drafting: true), EAGLE-1 and EAGLE-2 recipes on the fleet,
against NeMo's own co-located recipes: two servers, CPU, float32, the tiny random Llama; every micro-batch loss
(float32 bits) and every saved draft tensor equal, the trainer's copy of the target without weight files.

P-EAGLE's flex attention has no CPU backward in torch 2.13: both runs compute it as dense SDPA under the same
mask (peagle_cpu.py, never in the product)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch
from nemo_automodel.components.speculative.eagle import peagle_draft

from . import peagle_cpu
from .exactness import (
    SEED,
    Family,
    assert_exact,
    fleet_fixture,
    killing_after_third,
    recipe_yaml,
    references_fixture,
    run_prefetched,
    run_remote,
    saved_draft,
    start_fleet,
    target_fixture,
    weight_files,
)

PEAGLE = Family(
    "TrainEagle3Recipe",
    "nemo_automodel.recipes.llm.train_eagle3",
    dict(parallel_drafting=True, mask_token_id=0, num_depths=3, draft_vocab_size=128),
)
# NeMo's own prefetch (which it allows a remote target only), capped at the two servers.
PEAGLE_PREFETCHED = dataclasses.replace(
    PEAGLE, recipe_args={**PEAGLE.recipe_args, "target_prefetch_depth": 2}
)
EAGLE1 = Family("TrainEagle1Recipe", "nemo_automodel.recipes.llm.train_eagle1")
EAGLE2 = Family(
    "TrainEagle2Recipe", "nemo_automodel.recipes.llm.train_eagle2", loader_module=EAGLE1.nemo_module
)
FAMILIES = {f.recipe: f for f in (PEAGLE, EAGLE1, EAGLE2)}


@pytest.fixture(scope="module", autouse=True)
def dense_attention_on_cpu():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(peagle_draft, "_peagle_flex_attention", peagle_cpu.dense_peagle_attention)
        yield


target = target_fixture("llama")
fleet = fleet_fixture("127.0.0.2", "127.0.0.3")
references = references_fixture(FAMILIES)


# EAGLE-2 is EAGLE-1's class, so its compact run would be EAGLE-1's again.
@pytest.mark.parametrize(
    "recipe, compact",
    [(r, c) for r in sorted(FAMILIES) for c in (False, True) if not (r == "TrainEagle2Recipe" and c)],
)
def test_the_fleet_trains_the_draft_bit_identically_to_nemos_colocated_recipe(
    recipe, compact, target, fleet, references, tmp_path, monkeypatch
):
    extra = {"compact": True} if compact else {}
    family = PEAGLE_PREFETCHED if recipe == PEAGLE.recipe else FAMILIES[recipe]
    ours = run_prefetched(family, target, fleet, tmp_path, monkeypatch, **extra)
    assert_exact(ours, references(recipe))


def test_token_auth_and_a_server_sigkilled_mid_run_change_nothing(target, references, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    servers = start_fleet(target.model, ["127.0.0.4", "127.0.0.5"], "--auth-token-file", str(token))
    victim = servers[1]
    try:
        ours = run_remote(
            EAGLE1,
            target,
            [s.url for s in servers],
            tmp_path,
            on_micro_batch=killing_after_third(victim),
            auth_token_file=str(token),
            deadline=120,
        )
        assert victim.process.returncode == -9
    finally:
        for server in servers:
            server.kill()
    assert_exact(ours, references("TrainEagle1Recipe"))


def test_train_draft_trains_p_eagle_from_nemos_yaml_exactly(target, fleet, references, tmp_path, monkeypatch):
    """No recipe: key is EAGLE-3's recipe, and parallel_drafting in its YAML makes it P-EAGLE."""
    path = recipe_yaml(PEAGLE_PREFETCHED, target.config_only, target.chats, tmp_path)
    monkeypatch.setenv("EAGLE3_TARGET_SERVICE", ",".join(s.url for s in fleet))
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            peagle_cpu.COMMAND,
            "train-draft",
            "--config",
            str(path),
            f"--remote_target.seed={SEED}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got, reference = saved_draft(tmp_path / "checkpoints"), references("TrainEagle3Recipe").tensors
    assert got.keys() == reference.keys() and all(torch.equal(got[k], v) for k, v in reference.items())
    assert not weight_files(target.config_only)
