"""Packed sequences over the fleet (NeMo's packed_sequence_size), bit for bit as NeMo's co-located packed run.

NeMo refuses a remote target with packing; our TrainEagle3Recipe lifts that gate because the servers compute
under the same block-causal mask and per-document positions as NeMo's HFEagle3TargetModel. Every micro-batch
loss and every tensor of the saved draft must equal the co-located run's.
"""

from __future__ import annotations

import pytest
import torch
from nemo_automodel.components.datasets.llm.packed_sequence import build_block_causal_additive_mask
from nemo_automodel.recipes.llm import train_eagle3 as nemo_recipe

from eagle3_target.client.nemo import TrainEagle3Recipe
from eagle3_target.server.runners.packing import block_causal_mask

from .nemo_support import build_target, write_chats
from .test_nemo_trainer import SEED, CpuAutoModel, final_weights, load_config, recipe_yaml, start_fleet

PACKED = 64  # two or three of the example's conversations per row


def test_the_block_causal_mask_is_nemos_value_for_value():
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        rows = []
        for _ in range(3):
            cuts = torch.randint(
                0, 33, (int(torch.randint(0, 6, (), generator=generator)),), generator=generator
            )
            bounds = torch.cat([torch.tensor([0]), cuts.sort().values, torch.tensor([32])])
            rows.append(bounds.diff())
        width = max(len(r) for r in rows) + 1
        seq_lens = torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])
        for dtype in (torch.float32, torch.bfloat16):
            ours = block_causal_mask(seq_lens, 32, dtype, "cpu")
            nemo = build_block_causal_additive_mask(seq_lens, seq_length=32, dtype=dtype, device="cpu")
            assert torch.equal(ours, nemo), seq_lens


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    root = tmp_path_factory.mktemp("nemo-packed-target")
    return build_target(root / "model"), write_chats(root / "chats.jsonl", 24)


@pytest.fixture(scope="module")
def packed_fleet(target):
    servers = start_fleet(target[0], ["127.0.0.7", "127.0.0.8"])
    yield servers
    for server in servers:
        server.kill()


def run_recipe(recipe) -> tuple[list[torch.Tensor], dict]:
    """Train; every micro-batch's loss, in order."""
    losses = []
    forward = recipe._forward_batch

    def recorded(batch, target_batch=None):
        metrics = forward(batch, target_batch)
        losses.append(metrics.loss.detach().clone())
        return metrics

    torch.manual_seed(SEED)
    recipe.setup()
    recipe._forward_batch = recorded
    recipe.run_train_validation_loop()
    return losses


@pytest.fixture(scope="module")
def colocated_packed(target, tmp_path_factory):
    out = tmp_path_factory.mktemp("colocated-packed")
    cfg = load_config(recipe_yaml(out, target, recipe_args__packed_sequence_size=PACKED))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nemo_recipe, "NeMoAutoModelForCausalLM", CpuAutoModel)
        recipe = nemo_recipe.TrainEagle3Recipe(cfg)
        losses = run_recipe(recipe)
    assert "seq_lens" in next(iter(recipe.train_dataloader)), "the reference must pack"
    return losses, final_weights(out / "checkpoints")


@pytest.mark.parametrize("prefetch", [0, 2])  # NeMo's inline call and its prefetch loop
def test_packed_training_over_the_fleet_is_bit_identical(
    prefetch, packed_fleet, target, tmp_path, colocated_packed
):
    path = recipe_yaml(
        tmp_path,
        target,
        recipe_args__packed_sequence_size=PACKED,
        recipe_args__target_prefetch_depth=prefetch,
        remote_target__endpoints=",".join(s.url for s in packed_fleet),
    )
    before = [s.generated() for s in packed_fleet]
    losses = run_recipe(TrainEagle3Recipe(load_config(path)))
    ref_losses, ref_weights = colocated_packed
    assert len(losses) == len(ref_losses) > 1
    for got, want in zip(losses, ref_losses, strict=True):
        assert torch.equal(got, want), (losses, ref_losses)
    weights = final_weights(tmp_path / "checkpoints")
    assert weights.keys() == ref_weights.keys()
    for name, value in ref_weights.items():
        assert torch.equal(weights[name], value), name
    assert sum(s.generated() for s in packed_fleet) > sum(before)
