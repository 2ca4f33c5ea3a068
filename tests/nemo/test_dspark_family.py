"""NeMo AutoModel's DSpark recipe on the fleet, against NeMo's own co-located TrainDSparkRecipe: two servers,
CPU, float32, a tiny random Qwen3; every micro-batch loss (float32 bits) and every saved draft tensor equal,
the trainer's copy of the target without weight files. The captured layers include -1 (the embedding output)
and the last layer (the post-norm hidden state, which the fleet sends once as final_hidden).

DSpark's Qwen3 draft trains with flex attention, which has no CPU backward in torch 2.13: both runs switch it
to sdpa after setup() (a shim here, never in the product)."""

from __future__ import annotations

import dataclasses

import pytest

from eagle3_target.client import RemoteTargetBackend
from eagle3_target.client.nemo import TrainDSparkRecipe

from .exactness import (
    Family,
    assert_exact,
    load_config,
    make_target,
    recipe_yaml,
    run_colocated,
    run_remote,
    start_fleet,
)


def sdpa_draft(recipe) -> None:
    recipe.draft_model.config._attn_implementation = "sdpa"


DSPARK = Family(
    "TrainDSparkRecipe",
    "nemo_automodel.recipes.llm.train_dspark",
    dict(
        draft_num_hidden_layers=1,
        target_layer_ids=[-1, 3, 7],
        block_size=4,
        num_anchors=8,
        mask_token_id=3,
        markov_rank=16,
    ),
    after_setup=sdpa_draft,
)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_target(tmp_path_factory.mktemp("qwen3"), "qwen3")


@pytest.fixture(scope="module")
def fleet(target):
    servers = start_fleet(target.model, ["127.0.0.2", "127.0.0.3"])
    yield servers
    for server in servers:
        server.kill()


@pytest.fixture(scope="module")
def dspark(target):
    """With a validation set (the training chats): NeMo's end-of-epoch evaluation runs in both runs, its
    losses compared too, and the adapter prefetches the validation batches as well."""
    return dataclasses.replace(DSPARK, recipe_args={**DSPARK.recipe_args, "val_data_path": str(target.chats)})


@pytest.fixture(scope="module")
def reference(dspark, target, tmp_path_factory):
    return run_colocated(dspark, target, tmp_path_factory.mktemp("nemo-dspark"))


def no_synchronous_capture(*_args, **_kwargs):
    raise AssertionError("a training batch's features were asked for when the loop reached it, not ahead")


def test_the_fleet_trains_the_draft_bit_identically_to_nemos_colocated_recipe(
    dspark, target, fleet, reference, tmp_path, monkeypatch
):
    before = [s.generated() for s in fleet]
    monkeypatch.setattr(RemoteTargetBackend, "capture", no_synchronous_capture)
    ours = run_remote(dspark, target, [s.url for s in fleet], tmp_path)
    assert all(s.generated() > b for s, b in zip(fleet, before, strict=True)), "both servers must serve"
    assert len(reference.losses) == 16  # 8 training micro-batches, then the 8 of the validation pass
    assert_exact(ours, reference)


def test_a_server_sigkilled_mid_run_changes_nothing(dspark, target, fleet, reference, tmp_path):
    victim = start_fleet(target.model, ["127.0.0.4"])[0]

    def kill_after_third(micro_batch: int) -> None:
        if micro_batch == 3:
            assert victim.generated() > 0, "the victim must have served before it dies"
            victim.kill()

    try:
        ours = run_remote(
            dspark,
            target,
            [fleet[0].url, victim.url],
            tmp_path,
            on_micro_batch=kill_after_third,
            deadline=120,
        )
        assert victim.process.returncode == -9
    finally:
        victim.kill()
    assert_exact(ours, reference)


@pytest.mark.parametrize(
    ("recipe_args", "message"),
    [
        ({"cached_target_path": "/data/cache"}, "trains offline, without a target"),
        ({"multimodal": True}, "MiniMax M3 VL"),
    ],
)
def test_what_only_a_colocated_target_can_do_is_refused_in_one_line(target, tmp_path, recipe_args, message):
    family = Family(DSPARK.recipe, DSPARK.nemo_module, {**DSPARK.recipe_args, **recipe_args})
    path = recipe_yaml(
        family, target.config_only, target.chats, tmp_path, remote_target={"endpoints": "http://h:1"}
    )
    with pytest.raises(ValueError, match=message):
        TrainDSparkRecipe(load_config(path))
