"""The mistakes a new user of `train-draft` makes, each answered in one line with docs/cli.md's exit code: a URL
where no server answers (within remote_target.wait_timeout), a fleet serving another target than the recipe's."""

from __future__ import annotations

import asyncio

import pytest
import yaml
from target_support import free_port, serve

from eagle3_target.cli import main
from eagle3_target.exits import Exit
from eagle3_target.server.runners.synthetic import SyntheticRunner
from eagle3_target.server.runners.tiny import TINY_LLAMA

from .nemo_support import build_target, write_chats

ERROR = "eagle3-target train-draft: error: "


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    root = tmp_path_factory.mktemp("mistakes")
    model, chats = build_target(root / "model"), write_chats(root / "chats.jsonl", 4)
    config = {
        "dist_env": {"backend": "gloo"},
        "recipe_args": {
            "target_model_name_or_path": str(model),
            "train_data_path": str(chats),
            "seq_length": 32,
            "micro_batch_size": 2,
            "ttt_steps": 2,
            "num_epochs": 1,
            "draft_vocab_size": 128,
            "output_dir": str(root / "out"),
        },
        "optimizer": {"lr": 1e-3},
        "checkpoint": {"checkpoint_dir": str(root / "checkpoints")},
    }
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def one_error(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and lines[-1].startswith(ERROR), lines
    assert not any("Traceback" in line for line in lines), lines
    return lines[-1].removeprefix(ERROR), lines


def test_a_url_where_no_server_answers_ends_within_the_wait_in_one_line_and_exit_4(recipe, capsys, caplog):
    url = f"http://127.0.0.1:{free_port()}"
    args = ["train-draft", "--config", str(recipe), f"--remote_target.endpoints={url}"]
    assert main([*args, "--remote_target.wait_timeout=2"]) == Exit.UNREACHABLE
    error, _ = one_error(capsys)
    assert error.startswith(f"no target server became ready within 2s: {url} joining ("), error
    said = [r.getMessage() for r in caplog.records if r.name.startswith("eagle3_target.client")]
    assert f"waiting up to 2s for a target server to be ready: {url} joining" in said, said


def test_start_timeout_beside_wait_timeout_is_refused_as_a_second_wait(recipe, capsys):
    args = ["train-draft", "--config", str(recipe), "--remote_target.endpoints=http://127.0.0.1:9"]
    assert main([*args, "--remote_target.start_timeout=5"]) == Exit.USAGE
    assert "remote_target.wait_timeout alone" in one_error(capsys)[0]


def other_target() -> SyntheticRunner:
    """The recipe's shape and dtype, another config: what a fleet serving a sibling checkpoint looks like."""
    shape = {k: TINY_LLAMA[k] for k in ("num_hidden_layers", "hidden_size", "vocab_size")}
    return SyntheticRunner(**shape, dtype="float32")


async def test_a_fleet_serving_another_target_is_refused_naming_both_digests(recipe, capsys):
    async with serve(other_target) as fleet:
        args = ["train-draft", "--config", str(recipe), f"--remote_target.endpoints={fleet.url}"]
        assert await asyncio.to_thread(main, args) == Exit.USAGE
    error, _ = one_error(capsys)
    assert error.startswith("the fleet serves another target than recipe_args.target_model_name_or_path="), (
        error
    )
    assert f"here, {other_target().info.config_digest} on the fleet" in error
    assert "same layers, hidden size and vocabulary, another config" in error
    assert "remote_target.allow_target_mismatch: true" in error


async def test_allow_target_mismatch_trains_against_it_with_a_warning(recipe, tmp_path, caplog):
    async with serve(other_target) as fleet:
        args = ["train-draft", "--config", str(recipe), f"--remote_target.endpoints={fleet.url}"]
        more = [f"--checkpoint.checkpoint_dir={tmp_path}", "--remote_target.allow_target_mismatch=true"]
        assert await asyncio.to_thread(main, [*args, *more]) == Exit.OK
    assert any(
        "training anyway (remote_target.allow_target_mismatch)" in r.getMessage() for r in caplog.records
    )
