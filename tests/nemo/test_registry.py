"""client/nemo/registry.py and loading.py: every family found from the code (a protocol module, a declaration
and an adapter of the same name) or from an entry point, a family's adapter and NeMo recipe imported only
when it runs, and the YAML recipe: key in NeMo's forms."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from eagle3_target.client.nemo import registry
from eagle3_target.client.nemo.loading import recipe_class
from eagle3_target.client.nemo.registry import DEFAULT_RECIPE, by_recipe, recipe_name
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
    assert DEFAULT_RECIPE in str(refused.value)
    for known in registry.recipes():  # every family's recipes, as the registry lists them
        assert known in str(refused.value)
    assert "parallel_drafting" not in str(refused.value)  # a mode of TrainEagle3Recipe, not a class


def test_every_family_is_a_protocol_module_a_declaration_and_an_adapter_of_the_same_name():
    modules = {p.stem for p in (SRC / "protocol" / "families").glob("*.py")} - {"__init__"}
    declared = {p.stem for p in (SRC / "client" / "nemo" / "families").glob("*.py")} - {"__init__"}
    assert set(registry.families()) == set(protocol_families()) == modules == declared
    for name, found in registry.families().items():
        assert (SRC / "client" / "nemo" / f"{name}.py").is_file()
        assert found.adapter_module == f"eagle3_target.client.nemo.{name}"
        assert found.request is protocol_families()[name] and found.recipes
    for recipe, found in registry.recipes().items():
        assert recipe_class(recipe).__name__ == recipe and found.selected_by is None


# Run in a fresh interpreter: which adapters and NeMo recipe modules the registry, then one family, import.
IMPORTED = """
import json, sys
from eagle3_target.client.nemo import loading, registry
def loaded():
    return sorted(m for m in sys.modules if m.startswith(("eagle3_target.client.nemo.", "nemo_automodel.recipes.")))
registry.families(), registry.by_recipe("TrainEagle1Recipe"), registry.offline_caches()
listed, torch = loaded(), "torch" in sys.modules
loading.recipe_class(sys.argv[1])
print(json.dumps({"listed": listed, "ran": loaded(), "torch": torch}))
"""
# NeMo's recipe modules by shipped family (the ones the adapters subclass)
NEMO_RECIPES = {
    "dflash": ("train_dflash", "train_domino", "train_dflash2"),
    "dspark": ("train_dspark",),
    "eagle1": ("train_eagle1", "train_eagle2"),
    "eagle3": ("train_eagle3",),
    "jetspec": ("train_jetspec",),
    "peagle": (),
    "vispec": ("train_vispec",),
    "vispec_stage1": (),
}


@pytest.mark.timeout(
    600
)  # a fresh interpreter importing one NeMo recipe: a minute or more on a loaded machine
def test_a_family_imports_its_own_adapter_and_nemo_recipe_only_when_it_runs():
    env = {**os.environ, "PYTHONPATH": str(SRC.parent)}
    proc = subprocess.run(
        [sys.executable, "-c", IMPORTED, "TrainEagle1Recipe"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.splitlines()[-1])
    adapters = {f"eagle3_target.client.nemo.{name}" for name in registry.families()}
    assert not adapters & set(seen["listed"]) and not seen["torch"], seen["listed"]
    assert not any(m.startswith("nemo_automodel.") for m in seen["listed"])
    assert adapters & set(seen["ran"]) == {"eagle3_target.client.nemo.eagle1"}
    others = {
        f"nemo_automodel.recipes.llm.{m}" for f, ms in NEMO_RECIPES.items() if f != "eagle1" for m in ms
    }
    assert "nemo_automodel.recipes.llm.train_eagle1" in seen["ran"] and not others & set(seen["ran"])


PLUGIN = """
from eagle3_target.client.nemo.family import FleetFamily
from eagle3_target.protocol.families import Family
from eagle3_target.protocol.features import WEIGHT_LM_HEAD, Features

FAMILY = FleetFamily(
    name="{name}",
    recipes=("TrainPluginRecipe",),
    replaces="HFPluginTargetModel",
    adapter="plugin_family_adapter",
    protocol=Family(name="{name}", ask=lambda layers, _n: Features(layers=tuple(layers)), weights=(WEIGHT_LM_HEAD,)),
)
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A distribution installed nowhere but on sys.path: its dist-info names an entry point of the group."""

    def install(name: str = "plugin") -> None:
        (tmp_path / "plugin_family.py").write_text(PLUGIN.format(name=name))
        (tmp_path / "plugin_family_adapter.py").write_text("class TrainPluginRecipe:\n    pass\n")
        info = tmp_path / "plugin_family-1.0.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugin-family\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINTS}]\n{name} = plugin_family:FAMILY\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        registry.families.cache_clear()

    yield install
    registry.families.cache_clear()
    for module in ("plugin_family", "plugin_family_adapter"):
        sys.modules.pop(module, None)


def test_a_family_from_an_entry_point_is_found_trained_and_asked_for(plugin):
    plugin()
    found = registry.families()["plugin"]
    assert found.request.ask([2, 5], 8).layers == (2, 5) and found.request.weights == ("lm_head",)
    assert "plugin_family_adapter" not in sys.modules  # declared, not yet run
    assert by_recipe("TrainPluginRecipe") is found
    assert recipe_class("TrainPluginRecipe") is sys.modules["plugin_family_adapter"].TrainPluginRecipe
    assert set(registry.families()) - {"plugin"} == set(protocol_families())


def test_an_entry_point_that_takes_a_shipped_familys_name_is_refused(plugin):
    plugin("dflash")
    with pytest.raises(ValueError, match="entry point dflash = plugin_family:FAMILY .* that family exists"):
        registry.families()


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


def test_no_importlib_load_of_the_families_runs_back_to_its_loader():
    """registry.py loads the declarations and loading.py the adapters through importlib: no static chain
    runs from what either loads back to it, so neither load closes a circle."""
    graph = grimp.build_graph("eagle3_target")
    nemo = "eagle3_target.client.nemo"
    declarations = [f"{nemo}.families.{name}" for name in registry.families()]
    adapters = [f"{nemo}.{name}" for name in registry.families()]
    for declared in declarations:
        assert not graph.chain_exists(importer=declared, imported=f"{nemo}.registry"), declared
        for adapter in adapters:
            assert not graph.chain_exists(importer=declared, imported=adapter), (declared, adapter)
    for adapter in adapters:
        assert not graph.chain_exists(importer=adapter, imported=f"{nemo}.loading"), adapter
    assert not graph.chain_exists(importer=f"{nemo}.registry", imported=f"{nemo}.fleet_recipe")
