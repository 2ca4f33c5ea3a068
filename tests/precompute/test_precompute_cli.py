"""The command's flags are NeMo's (same names, same defaults), and bad input is one line before any work
(status 2; an unreachable fleet 4, as for every command): nothing is written, no dataset is loaded."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest
from nemo_automodel.components.speculative import precompute_eagle3
from target_support import free_port

from eagle3_target.client.precompute.cache import VERSION_FILE
from eagle3_target.client.precompute.options import add_arguments
from eagle3_target.exits import Exit

from .precompute_support import argv, cache_files, precompute, served_version

NOT_OURS = {"device", "log_level", "help"}  # the fleet runs the target; the top-level CLI sets the log level


def actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions}


def test_nemos_flags_with_nemos_defaults():
    ours = argparse.ArgumentParser()
    add_arguments(ours)
    theirs, mine = actions(precompute_eagle3._build_parser()), actions(ours)
    for dest, action in theirs.items():
        if dest in NOT_OURS:
            continue
        assert dest in mine, dest
        assert mine[dest].option_strings == action.option_strings, dest
        assert (mine[dest].default, mine[dest].required, mine[dest].nargs) == (
            action.default,
            action.required,
            action.nargs,
        ), dest
        assert mine[dest].type == action.type and mine[dest].choices == action.choices, dest


def closed_port() -> str:
    return f"http://127.0.0.9:{free_port('127.0.0.9')}"


def one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if line.startswith("eagle3-target precompute: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines
    return errors[0].removeprefix("eagle3-target precompute: error: ")


def test_a_dataset_that_does_not_exist(target, tmp_path, capsys):
    missing = tmp_path / "missing.jsonl"
    assert precompute(*argv(closed_port(), tmp_path / "out", target[0], missing)) == 2
    assert one_error_line(capsys) == f"--input-data {missing}: no such file or directory"
    assert not (tmp_path / "out").exists()


def test_a_shard_size_that_is_not_a_multiple_of_the_batch_size(target, tmp_path, capsys):
    assert precompute(*argv(closed_port(), tmp_path, *target, "--shard-size", "5")) == 2
    assert one_error_line(capsys) == (
        "--shard-size (5) must be a multiple of --batch-size (2) so shards align to batch boundaries"
    )


def test_an_output_directory_with_shards_and_no_resume(target, tmp_path, capsys):
    (tmp_path / "shard-000000.safetensors").write_bytes(b"earlier run")
    assert precompute(*argv(closed_port(), tmp_path, *target)) == 2
    assert one_error_line(capsys) == (
        f"{tmp_path} already has shards; pass --resume to continue or use a fresh dir"
    )
    assert cache_files(tmp_path) == {"shard-000000.safetensors": b"earlier run"}


def test_a_target_version_that_is_no_version(target, tmp_path, capsys):
    assert precompute(*argv(closed_port(), tmp_path / "out", *target, "--target-version", "step 9")) == 2
    assert one_error_line(capsys).startswith(
        "--target-version: target_version is 'newest' or a target version"
    )
    assert not (tmp_path / "out").exists()


def test_a_resumed_cache_of_another_target_version_is_refused(hf_server, target, tmp_path, capsys):
    (tmp_path / VERSION_FILE).write_text('{"target_version": "policy-1"}')
    assert precompute(*argv(hf_server.url, tmp_path, *target, "--resume")) == 2
    version = served_version(hf_server.url)
    assert one_error_line(capsys) == (
        f"{tmp_path} holds a cache made from target version policy-1, and this run's is {version}: "
        "pass --target-version policy-1 while the fleet serves it, or use a fresh directory"
    )
    assert not any(name.startswith("shard") for name in cache_files(tmp_path))


def test_an_empty_fleet(target, tmp_path, capsys):
    url = closed_port()
    assert precompute(*argv(url, tmp_path / "out", *target, "--start-timeout", "2")) == Exit.UNREACHABLE
    assert one_error_line(capsys).startswith(f"no target server became ready within 2s: {url} ")
    assert not (tmp_path / "out").exists()


def test_a_refusal_in_a_process_of_its_own_is_exactly_one_line(target, tmp_path):
    """At the default log level, with NeMo's, torchao's and torch's import-time notices in the same process."""
    (tmp_path / "shard-000000.safetensors").write_bytes(b"a finished run")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "TORCH_LOGS")}
    command = [sys.executable, "-m", "eagle3_target.cli", *argv(closed_port(), tmp_path, *target)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert (done.returncode, done.stdout) == (2, "")
    assert (
        done.stderr
        == f"eagle3-target precompute: error: {tmp_path} already has shards; pass --resume to continue or use a fresh dir\n"
    )


def test_a_fleet_serving_another_model(hf_server, slow_fleet, target, tmp_path, capsys):
    model = slow_fleet[1]  # 32 layers; the HF server's target has 8
    assert precompute(*argv(hf_server.url, tmp_path / "out", model, target[1])) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"the fleet does not serve --target-model {model} (num_hidden_layers: 32 here, 8 ")
    assert "config_digest" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--worker-count", "2", "--worker-index", "2"], "--worker-index 2 is outside 0..1 (--worker-count)"),
        (["--target-probs-topk", "-1"], "--target-probs-topk must be >= 0, got -1"),
    ],
)
def test_other_bad_flags(flags, message, target, tmp_path, capsys):
    assert precompute(*argv(closed_port(), tmp_path, *target, *flags)) == 2
    assert one_error_line(capsys) == message
