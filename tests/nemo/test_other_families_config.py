"""What the DSpark, EAGLE-1/2 and P-EAGLE adapters refuse, in one line and before any slow work (no server:
the refusals come before the client connects)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

import eagle3_target.client.nemo as ours

from .exactness import Family, load_config, make_target, recipe_yaml

PEAGLE_ARGS = dict(parallel_drafting=True, mask_token_id=0, num_depths=3)
CASES = [
    ("TrainEagle3Recipe", {}, {"distributed": {"tp_size": 2}}, {}, "tp_size>1 shards a co-located target"),
    ("TrainEagle3Recipe", {}, {}, {"compact": "yes"}, "remote_target.compact='yes': true or false"),
    ("TrainEagle1Recipe", {}, {}, {"compact": 1}, "remote_target.compact=1: true or false"),
    ("TrainEagle2Recipe", {}, {"distributed": {"tp_size": 2}}, {}, "tp_size>1 shards a co-located target"),
    ("TrainEagle1Recipe", {}, {}, {"prefetch_depth": 0}, "remote_target.prefetch_depth=0"),
    ("TrainDSparkRecipe", {"cached_target_path": "/c"}, {}, {}, "cached_target_path trains offline"),
    ("TrainDSparkRecipe", {}, {"distributed": {"cp_size": 2}}, {}, "cp_size>1 shards a co-located target"),
]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_target(tmp_path_factory.mktemp("llama"), "llama")


@pytest.mark.parametrize(("recipe", "recipe_args", "sections", "remote", "message"), CASES)
def test_a_bad_config_is_refused_in_one_line(
    target, tmp_path, recipe, recipe_args, sections, remote, message
):
    args = {**(PEAGLE_ARGS if recipe == "TrainEagle3Recipe" else {}), **recipe_args}
    family = Family(recipe, "unused", args)
    section = {"endpoints": "http://127.0.0.1:9", **remote}
    path = recipe_yaml(family, target.config_only, target.chats, tmp_path, remote_target=section, **sections)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as refused:
        getattr(ours, recipe)(load_config(path))
    assert "\n" not in str(refused.value)


def test_compact_is_p_eagles_not_eagle3s(target, tmp_path):
    family = Family("TrainEagle3Recipe", "unused", {"draft_vocab_size": 128})
    section = {"endpoints": "http://127.0.0.1:9", "compact": True}
    path = recipe_yaml(family, target.config_only, target.chats, tmp_path, remote_target=section)
    with pytest.raises(ValueError, match=r"compact applies to P-EAGLE \(parallel_drafting: true\)"):
        ours.TrainEagle3Recipe(load_config(path))


def test_the_docs_p_eagle_yaml_is_one_the_remote_recipe_accepts(tmp_path, monkeypatch):
    doc = Path(__file__).resolve().parents[2] / "docs" / "families.md"
    blocks = map(yaml.safe_load, re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S))
    config = next(b for b in blocks if b.get("recipe_args", {}).get("parallel_drafting"))
    path = tmp_path / "peagle.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("EAGLE3_TARGET_SERVICE", "dns://llama.default.svc.cluster.local:8001")
    monkeypatch.delenv("EAGLE3_TARGET_AUTH_TOKEN_FILE", raising=False)
    recipe = ours.TrainEagle3Recipe(load_config(path))
    assert recipe.parallel_drafting and recipe.compact
    assert recipe.cfg.get("recipe_args.target_model_backend") == "colocated"  # NeMo's gate; the fleet's hook
