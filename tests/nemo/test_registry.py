"""client/nemo/registry.py: every family found from the code (a protocol module and a trainer module of the
same name), and the YAML recipe: key in NeMo's forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3_target.client.nemo import registry
from eagle3_target.client.nemo.registry import DEFAULT_RECIPE, by_recipe, recipe_class, recipe_name
from eagle3_target.protocol.families import families as protocol_families
from eagle3_target.protocol.features import LOGITS_FULL, LOGITS_NONE

DFLASH_FAMILY = ("TrainDFlashRecipe", "TrainJetSpecRecipe", "TrainDominoRecipe", "TrainDFlash2Recipe")
SRC = Path(registry.__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (None, DEFAULT_RECIPE),
        ("TrainDFlashRecipe", "TrainDFlashRecipe"),
        (" nemo_automodel.recipes.llm.train_jetspec.TrainJetSpecRecipe ", "TrainJetSpecRecipe"),
        ({"_target_": "nemo_automodel.recipes.llm.train_domino.TrainDominoRecipe"}, "TrainDominoRecipe"),
    ],
)
def test_the_recipe_key_in_each_of_nemos_forms(value, name):
    assert recipe_name(value) == name


@pytest.mark.parametrize("value", ["", 3, ["TrainDFlashRecipe"], {"name": "TrainDFlashRecipe"}])
def test_a_recipe_key_that_names_no_class_is_refused(value):
    with pytest.raises(ValueError, match="is not a recipe class name"):
        recipe_name(value)


def test_an_unknown_recipe_names_the_ones_there_are():
    with pytest.raises(ValueError) as refused:
        by_recipe("TrainMedusaRecipe")
    assert "TrainMedusaRecipe is not a recipe the fleet trains" in str(refused.value)
    for known in (DEFAULT_RECIPE, *DFLASH_FAMILY):
        assert known in str(refused.value)
    assert "parallel_drafting" not in str(refused.value)  # a mode of TrainEagle3Recipe, not a class


def test_every_family_is_a_protocol_module_and_a_trainer_module_of_the_same_name():
    modules = {p.stem for p in (SRC / "protocol" / "families").glob("*.py")} - {"__init__"}
    assert set(registry.families()) == set(protocol_families()) == modules
    for name, found in registry.families().items():
        assert (SRC / "client" / "nemo" / f"{name}.py").is_file()
        assert found.request is protocol_families()[name] and found.recipes
    for recipe, found in registry.recipes().items():
        assert recipe_class(recipe).__name__ == recipe and found.selected_by is None


def test_a_recipe_args_flag_selects_a_family_inside_another_familys_recipe():
    assert by_recipe(DEFAULT_RECIPE).name == "eagle3"
    assert by_recipe(DEFAULT_RECIPE, {"parallel_drafting": False}).name == "eagle3"
    assert by_recipe(DEFAULT_RECIPE, {"parallel_drafting": True}).name == "peagle"


def test_the_dflash_family_asks_for_unshifted_layers_and_jetspec_for_full_logits_too():
    for name in DFLASH_FAMILY:
        found = by_recipe(name)
        assert found.replaces == "HFDFlashTargetModel"
        features = found.request.ask([1, 4, 7], 8)
        assert features.layers == (1, 4, 7) and not features.shift and not features.final_hidden
        assert features.logits == (LOGITS_FULL if name == "TrainJetSpecRecipe" else LOGITS_NONE)
        assert found.request.weights == ("input_embeddings", "lm_head")
