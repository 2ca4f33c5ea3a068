"""How NeMo's recipe finds the fleet, and what train-draft says when something is wrong (no model runs here)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from nemo_automodel.components.config._arg_parser import parse_args_and_load_config
from nemo_automodel.components.config.loader import ConfigNode
from target_support import serve

from eagle3_target.cli import main
from eagle3_target.client.cli_train_draft import override_argv
from eagle3_target.client.nemo import NeMoTargetBackend, TrainEagle3Recipe
from eagle3_target.server.runners.synthetic import SyntheticRunner

REPO = Path(__file__).resolve().parents[2]


def slow_runner() -> SyntheticRunner:
    time.sleep(2.0)  # a target still loading its weights when the trainer starts
    return SyntheticRunner()


async def test_the_recipe_lets_every_discovered_server_join_before_nemo_sizes_its_prefetch():
    async with (
        serve(SyntheticRunner, host="127.0.0.2") as ready,
        serve(slow_runner, host="127.0.0.3", wait=False) as loading,
    ):
        cfg = ConfigNode(
            {
                "recipe_args": {"target_prefetch_depth": 8},
                "remote_target": {"endpoints": [ready.url, loading.url], "wait_timeout": 60},
            }
        )
        recipe = TrainEagle3Recipe(cfg)
        recipe.device = torch.device("cpu")
        recipe.dist_env = SimpleNamespace(is_main=True)
        await asyncio.to_thread(recipe._setup_remote_target, cfg.recipe_args)
        try:
            assert isinstance(recipe.target_wrapper, NeMoTargetBackend)
            assert recipe.target_wrapper.num_remote_servers == 2
            assert recipe._resolve_prefetch_depth(cfg.recipe_args) == 2
        finally:
            await asyncio.to_thread(recipe.target_wrapper.close)


def write_config(tmp_path, **recipe_args) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"recipe_args": recipe_args}))
    return str(path)


def test_train_draft_refuses_a_config_that_is_not_yaml_in_one_line(tmp_path, capsys):
    broken = tmp_path / "broken.yaml"
    broken.write_text("recipe_args: [unclosed\n")
    assert main(["train-draft", "--config", str(broken)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("eagle3-target train-draft: error: "), err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config", "/nonexistent.yaml"], "--config /nonexistent.yaml: no such file"),
        (["--config", "{cfg}", "stray"], "unexpected argument 'stray'"),
        (["--config", "{cfg}"], "$EAGLE3_TARGET_SERVICE is not set"),
        (["--config", "{cfg}", "--remote_target.endpoints=ftp//x"], "has no scheme"),
        (
            [
                "--config",
                "{cfg}",
                "--remote_target.endpoints",
                "http://127.0.0.2:1",
                "--remote_target.colour=red",
            ],
            "unknown client option(s) colour",
        ),
        (
            [
                "--config",
                "{cfg}",
                "--remote_target.endpoints=http://127.0.0.2:1",
                "--remote_target.auth_token_file=/nope",
            ],
            "remote_target.auth_token_file=/nope",
        ),
        (
            ["--config", "{cfg}", "--recipe_args.target_model_backend=colocated"],
            "use NeMo's own TrainEagle3Recipe for a co-located target",
        ),
        (["--config", "{cfg}", "--recipe_args.remote_urls=[http://127.0.0.2:1]"], "remote_target.endpoints"),
        (
            ["--config", "{cfg}", "--recipe_args.seq_lenght=32"],
            "recipe_args.seq_lenght: TrainEagle3Recipe has no such setting; did you mean seq_length?",
        ),
        (
            ["--config", "{cfg}", "--recipe_args.micro_batch_size=abc"],
            "recipe_args.micro_batch_size='abc': TrainEagle3Recipe takes an integer",
        ),
    ],
)
def test_train_draft_refuses_bad_input_in_one_line_before_any_slow_work(
    args, message, tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("EAGLE3_TARGET_SERVICE", raising=False)
    monkeypatch.delenv("EAGLE3_TARGET_AUTH_TOKEN_FILE", raising=False)
    cfg = write_config(tmp_path, target_model_name_or_path="/does/not/matter")
    code = main(["train-draft", *(a.replace("{cfg}", cfg) for a in args)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("eagle3-target train-draft: error: "), err
    assert message in err


def test_other_commands_still_reject_unknown_arguments(capsys):
    assert main(["probe", "--checkpoint.checkpoint_dir=/tmp/x"]) == 2
    assert "unrecognized arguments: --checkpoint.checkpoint_dir=/tmp/x" in capsys.readouterr().err


BLOCK_NEMO = "import sys; sys.modules['nemo_automodel'] = None; "


def test_without_nemo_the_import_error_says_what_to_install():
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_NEMO + "import eagle3_target.client.nemo"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert "ImportError: eagle3_target.client.nemo needs NVIDIA NeMo AutoModel" in done.stderr
    assert "pip install 'eagle3-target[nemo]'" in done.stderr


def test_without_nemo_train_draft_says_what_to_install_in_one_line(tmp_path):
    cfg = write_config(tmp_path)
    code = (
        BLOCK_NEMO
        + f"from eagle3_target.cli import main; sys.exit(main(['train-draft', '--config', {cfg!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 5  # not installed (docs/cli.md)
    assert done.stderr.count("\n") == 1 and "pip install 'eagle3-target[nemo]'" in done.stderr, done.stderr
    # and the rest of the client does not need NeMo at all
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            BLOCK_NEMO + "import eagle3_target.client, eagle3_target.client.cli_train_draft",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def test_the_example_trainer_job_runs_train_draft_on_a_recipe_nemo_accepts(tmp_path, monkeypatch):
    docs = list(yaml.safe_load_all((REPO / "manifests" / "example-trainer-job.yaml").read_text()))
    job = next(d for d in docs if d["kind"] == "Job")
    recipe_map = next(d for d in docs if d["kind"] == "ConfigMap")
    pod = job["spec"]["template"]["spec"]
    trainer = pod["containers"][0]
    mounted = {v["name"]: v for v in pod["volumes"]}
    config_mount = next(m for m in trainer["volumeMounts"] if mounted[m["name"]].get("configMap"))
    assert mounted[config_mount["name"]]["configMap"]["name"] == recipe_map["metadata"]["name"]

    # The command, with the ConfigMap's file where the pod mounts it, goes through our CLI and NeMo's parser.
    command = trainer["command"]
    assert command[:2] == ["eagle3-target", "train-draft"]
    config_arg = next(a for a in command if a.startswith("--config="))
    file_name = config_arg.removeprefix(f"--config={config_mount['mountPath']}/")
    local = tmp_path / file_name
    local.write_text(recipe_map["data"][file_name])
    overrides = override_argv([a for a in command[2:] if a != config_arg])
    cfg = parse_args_and_load_config(argv=["--config", str(local), *overrides])
    assert cfg.checkpoint.checkpoint_dir == "/data/checkpoints/llama-draft"
    for key in (
        "target_model_name_or_path",
        "train_data_path",
        "seq_length",
        "micro_batch_size",
        "ttt_steps",
    ):
        assert cfg.get(f"recipe_args.{key}") is not None, key
    assert cfg.get("recipe_args.target_prefetch_depth") >= 2

    # In the pod, the endpoints and the token come from the client ConfigMap and the Secret, through env.
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    monkeypatch.setenv("EAGLE3_TARGET_SERVICE", "srv://_http._tcp.llama.default.svc.cluster.local")
    monkeypatch.setenv("EAGLE3_TARGET_AUTH_TOKEN_FILE", str(token))
    settings = TrainEagle3Recipe(cfg).remote_target
    assert settings.endpoints == "srv://_http._tcp.llama.default.svc.cluster.local"
    assert (
        settings.auth_token == "t0ken"
        and settings.client_options == {"start_timeout": 300}
        and settings.wait_timeout == 300
    )
