"""Packed sequences (packed_sequence_size) for NeMo's DFlash and DSpark recipes on the fleet: every micro-batch
loss and every saved draft tensor equal NeMo's co-located packed run, the captured layers computed under the
block-causal mask with per-document positions. (EAGLE-3's packed run: test_nemo_packing.py.)"""

from __future__ import annotations

import dataclasses

import pytest

from .exactness import assert_exact, make_target, run_colocated, run_remote, start_fleet
from .test_dflash_family import FAMILIES
from .test_dspark_family import DSPARK

PACKED = {"packed_sequence_size": 64}  # two or three of the example's conversations per row


def packed(family):
    return dataclasses.replace(family, recipe_args={**family.recipe_args, **PACKED})


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_target(tmp_path_factory.mktemp("qwen3-packed"), "qwen3", chats=32)


@pytest.fixture(scope="module")
def fleet(target):
    servers = start_fleet(target.model, ["127.0.0.13", "127.0.0.14"])
    yield servers
    for server in servers:
        server.kill()


@pytest.mark.parametrize("family", [FAMILIES["TrainDFlashRecipe"], DSPARK], ids=lambda f: f.recipe)
def test_packed_training_over_the_fleet_is_bit_identical(family, target, fleet, tmp_path):
    family = packed(family)
    reference = run_colocated(family, target, tmp_path / "nemo")
    before = sum(s.generated() for s in fleet)
    ours = run_remote(family, target, [s.url for s in fleet], tmp_path / "ours")
    assert sum(s.generated() for s in fleet) > before
    assert_exact(ours, reference)
