"""The family recipes' exports, train-draft's dispatch on the YAML's recipe: key, and docs/families.md, without
training (tests/nemo/test_dflash_family.py trains)."""

from __future__ import annotations

import importlib
import re

import pytest
import yaml
from nemo_automodel.components.config.loader import ConfigNode

import eagle3_target.client.nemo as ours
from eagle3_target.cli import main
from eagle3_target.client.nemo.fleet_recipe import FleetRecipe
from eagle3_target.client.nemo.registry import families, recipes

from .family_table import DOC, docs_rows, example_applied, example_files, table_rows


@pytest.mark.parametrize("recipe", sorted(recipes()))
def test_each_family_recipe_is_exported_as_a_subclass_of_nemos_own(recipe):
    assert recipe in ours.__all__
    ours_class = getattr(ours, recipe)
    nemo = [c for c in ours_class.__mro__[1:] if c.__module__.startswith("nemo_automodel.recipes.")]
    assert issubclass(ours_class, FleetRecipe) and nemo and ours_class.__name__ == recipe
    if hasattr(importlib.import_module(nemo[0].__module__), recipe):  # a NeMo recipe of that name: that one
        assert nemo[0].__name__ == recipe


def test_the_docs_family_table_is_the_codes_with_the_worked_example_applied(tmp_path):
    assert set(example_files()) == {
        "src/eagle3_target/protocol/families/toy.py",
        "src/eagle3_target/client/nemo/families/toy.py",
        "src/eagle3_target/client/nemo/toy.py",
    }
    with example_applied(tmp_path):
        rendered = table_rows(families())
    assert docs_rows() == rendered, (
        "docs/families.md's table is stale: PYTHONPATH=src python -m tests.nemo.family_table"
    )


def doc_recipe(name: str) -> dict:
    """The recipe YAML the docs give for ``name``: a yaml block, or a ConfigMap's recipe.yaml in a quickstart."""
    text = DOC.read_text()
    recipes = list(map(yaml.safe_load, re.findall(r"```yaml\n(.*?)```", text, re.S)))
    for manifest in re.findall(r"<<'YAML'\n(.*?)\nYAML\n", text, re.S):
        for doc in yaml.safe_load_all(manifest):
            if doc and doc.get("kind") == "ConfigMap" and "recipe.yaml" in doc.get("data", {}):
                recipes.append(yaml.safe_load(doc["data"]["recipe.yaml"]))
    return next(d for d in recipes if d and d.get("recipe") == name)


def test_the_docs_dflash_recipe_is_one_the_remote_recipe_accepts(monkeypatch, tmp_path):
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    monkeypatch.setenv("EAGLE3_TARGET_SERVICE", "srv://_http._tcp.qwen3.default.svc.cluster.local")
    monkeypatch.setenv("EAGLE3_TARGET_AUTH_TOKEN_FILE", str(token))
    recipe = ours.TrainDFlashRecipe(ConfigNode(doc_recipe("TrainDFlashRecipe")))
    settings = recipe.remote_target
    assert settings.endpoints == "srv://_http._tcp.qwen3.default.svc.cluster.local"
    assert settings.auth_token == "t0ken" and settings.wait_timeout == 300


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("--recipe=TrainMedusaRecipe", "recipe: TrainMedusaRecipe is not a recipe the fleet trains"),
        ("--distributed.tp_size=2", "distributed.tp_size>1 shards a co-located target"),
        ("--remote_target.prefetch_depth=0", "remote_target.prefetch_depth=0: a positive integer"),
        ("--remote_target.compact=true", "TrainDFlashRecipe has no compact request"),
        ("--remote_target.compact=3", "remote_target.compact=3: true or false"),
    ],
)
def test_train_draft_refuses_a_bad_family_config_in_one_line(override, message, tmp_path, capsys):
    path = tmp_path / "recipe.yaml"
    config = {"recipe": "TrainDFlashRecipe", "remote_target": {"endpoints": "http://127.0.0.2:1"}}
    path.write_text(yaml.safe_dump(config))
    assert main(["train-draft", "--config", str(path), override]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("eagle3-target train-draft: error: "), err
    assert message in err
