"""The family recipes' exports, train-draft's dispatch on the YAML's recipe: key, and docs/families.md, without
training (tests/nemo/test_dflash_family.py trains)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import yaml
from nemo_automodel.components.config.loader import ConfigNode

import eagle3_target.client.nemo as ours
from eagle3_target.cli import main
from eagle3_target.protocol.families import families

DOC = Path(__file__).resolve().parents[2] / "docs" / "families.md"
NEMO_MODULES = {
    "TrainEagle3Recipe": "train_eagle3",
    "TrainDFlashRecipe": "train_dflash",
    "TrainJetSpecRecipe": "train_jetspec",
    "TrainDominoRecipe": "train_domino",
    "TrainDFlash2Recipe": "train_dflash2",
}


@pytest.mark.parametrize("recipe", sorted(NEMO_MODULES))
def test_each_family_recipe_is_exported_as_a_subclass_of_nemos_own(recipe):
    nemo = getattr(importlib.import_module(f"nemo_automodel.recipes.llm.{NEMO_MODULES[recipe]}"), recipe)
    assert recipe in ours.__all__
    assert issubclass(getattr(ours, recipe), nemo) and getattr(ours, recipe).__name__ == recipe


EXAMPLE_LAYERS, EXAMPLE_DEPTH = (1, 4, 7), 8  # the docs table shows each request for these


def table_row(found) -> str:
    cells = [
        found.name,
        ", ".join(f"`{r}`" for r in found.recipes),
        f"`{found.ask(EXAMPLE_LAYERS, EXAMPLE_DEPTH).to_header()}`",
        ", ".join(found.weights),
        "-" if found.compact is None else f"`{found.compact(EXAMPLE_LAYERS, EXAMPLE_DEPTH).to_header()}`",
        f"`{found.adapter_module}.py`",
    ]
    return "| " + " | ".join(cells) + " |"


def test_the_docs_family_table_is_the_codes():
    rows = [line for line in DOC.read_text().splitlines() if re.match(r"\| \w+ \| `", line)]
    assert rows == [table_row(families()[name]) for name in sorted(families())]


def doc_recipe(name: str) -> dict:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    return next(d for d in map(yaml.safe_load, blocks) if d.get("recipe") == name)


def test_the_docs_dflash_recipe_is_one_the_remote_recipe_accepts(monkeypatch, tmp_path):
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    monkeypatch.setenv("EAGLE3_TARGET_SERVICE", "srv://_http._tcp.qwen3.default.svc.cluster.local")
    monkeypatch.setenv("EAGLE3_TARGET_AUTH_TOKEN_FILE", str(token))
    recipe = ours.TrainDFlashRecipe(ConfigNode(doc_recipe("TrainDFlashRecipe")))
    kwargs, wait_timeout = recipe.remote_target
    assert kwargs == {"endpoints": "srv://_http._tcp.qwen3.default.svc.cluster.local", "auth_token": "t0ken"}
    assert wait_timeout == 300


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
