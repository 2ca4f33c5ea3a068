"""NeMo's ``regen:`` and ``decode_eval:`` blocks in our EAGLE-3 recipe, run against a real fleet server (the
tiny target, token auth on): no vLLM is booted and no GPU reserved, NeMo's cadence and swap are kept, and a cycle
still running when training ends is waited for."""

from __future__ import annotations

import argparse
import json
import logging
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle3_target.client.nemo import TrainEagle3Recipe
from eagle3_target.client.nemo.fleet_cycles import FleetDecodeEvalRunner, FleetRegenRunner

from .exactness import SEED, load_config, start_fleet
from .nemo_support import build_target, write_chats

# each cycle is a worker process that imports NeMo's data stack: seconds on an idle machine, minutes on a busy one
pytestmark = pytest.mark.timeout(900)

TOKEN = "regen-token"
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    root = tmp_path_factory.mktemp("cycles-target")
    return build_target(root / "model"), write_chats(root / "chats.jsonl", 16)


@pytest.fixture(scope="module")
def drafts(tmp_path_factory) -> Path:
    """The server's --draft-dir-root: a decode_eval run writes its snapshots under it, as on a shared volume."""
    return tmp_path_factory.mktemp("drafts")


@pytest.fixture(scope="module")
def fleet(target, drafts, tmp_path_factory):
    token_file = tmp_path_factory.mktemp("token") / "token"
    token_file.write_text(TOKEN + "\n")
    server = start_fleet(
        target[0], ["127.0.0.9"], "--auth-token-file", str(token_file), "--draft-dir-root", str(drafts)
    )[0]
    yield server, token_file
    server.kill()


def recipe(out: Path, target, fleet, remote_target=None, **blocks) -> TrainEagle3Recipe:
    """Our EAGLE-3 recipe on 16 chats (8 optimizer steps), with NeMo's blocks as given."""
    model, chats = target
    server, token_file = fleet
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
            "output_dir": str(out),
            "log_every_steps": 2,
            **blocks,
        },
        "optimizer": {"lr": 1e-3},
        "checkpoint": {"checkpoint_dir": str(out / "checkpoints")},
        "remote_target": {
            "endpoints": server.url,
            "auth_token_file": str(token_file),
            **(remote_target or {}),
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    return TrainEagle3Recipe(load_config(path))


def greedy_answers(model_dir: Path, prompts: list[list[dict]]) -> list[str]:
    """transformers' own greedy generation of each chat prompt, decoded as OpenAI servers decode."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    answers = []
    for prompt in prompts:
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW_TOKENS
        )
        answers.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    return answers


def test_regen_runs_on_the_fleet_with_nemos_cadence_swap_and_a_last_cycle_waited_for(
    target, fleet, tmp_path, caplog, monkeypatch
):
    regen = {
        "every_steps": 3,
        "cuda_visible_devices": "7",  # NeMo's reserved GPU: accepted and ignored
        "max_new_tokens": NEW_TOKENS,
        "temperature": 0.0,
        "concurrency": 4,
        "shard_size": 8,
        "timeout_s": 120,
    }
    with caplog.at_level(logging.INFO):
        ours = recipe(tmp_path, target, fleet, regen=regen)
        rebuilt: list[str] = []
        build = ours._build_train_dataloader
        monkeypatch.setattr(
            ours, "_build_train_dataloader", lambda path, split: rebuilt.append(path) or build(path, split)
        )
        torch.manual_seed(SEED)
        ours.setup()
        runner = ours.regen_runner
        assert isinstance(runner, FleetRegenRunner)
        launch = runner.maybe_launch

        def first_cycle_at_once(step: int) -> bool:
            # the step-3 cycle is waited for here, so the swap at that window boundary is certain; the
            # step-6 one runs on while training ends at step 8
            launched = launch(step)
            if launched and step == 3:
                runner._proc.wait(timeout=120)
            return launched

        monkeypatch.setattr(runner, "maybe_launch", first_cycle_at_once)
        ours.run_train_validation_loop()
    assert "regen.cuda_visible_devices=7 is ignored" in caplog.text
    cycles = tmp_path / "regen"
    # setup's loader, then NeMo's swap to the first cycle's shards
    assert rebuilt == [str(target[1]), str(cycles / "cycle_3" / "shards")]
    assert "regen: the cycle for step 6 ended after training" in caplog.text
    assert "regen: cycle 6 is ready" in caplog.text
    rows = [
        row
        for shard in sorted((cycles / "cycle_6" / "shards").glob("shard-*.parquet"))
        for row in pq.read_table(shard).to_pylist()
    ]
    assert len(rows) == 16
    prompts = [row["messages"][:-1] for row in rows]
    assert all(p == row["original_messages"][:-1] for p, row in zip(prompts, rows, strict=True))
    assert [row["messages"][-1]["content"] for row in rows] == greedy_answers(target[0], prompts)


class Recorder:
    """Stands in for the W&B run NeMo's recipe logs to (``_wandb_log``)."""

    def __init__(self):
        self.logged: list[tuple[int, dict]] = []

    def log(self, data: dict, step: int) -> None:
        self.logged.append((step, data))

    def finish(self) -> None:
        pass


def test_decode_eval_runs_on_the_fleet_and_logs_tau_real_under_nemos_names(target, fleet, drafts, caplog):
    decode_eval = {"every_steps": 4, "num_prompts": 4, "max_new_tokens": 8, "num_speculative_tokens": 2}
    out = drafts / "run"
    ours = recipe(out, target, fleet, remote_target={"draft_root": str(drafts)}, decode_eval=decode_eval)
    torch.manual_seed(SEED)
    ours.setup()
    assert isinstance(ours.decode_eval_runner, FleetDecodeEvalRunner)
    ours.wandb_run = Recorder()
    with caplog.at_level(logging.INFO):
        ours.run_train_validation_loop()
    logged = [(step, data) for step, data in ours.wandb_run.logged if "train/tau_real" in data]
    assert logged, caplog.text[-3000:]
    step, last = logged[-1]
    assert step == 8 and last["train/tau_real_step"] in (4, 8)
    assert 1.0 <= last["train/tau_real"] <= 3.0  # 1 + up to K=2 accepted tokens per target step
    assert 0.0 <= last["train/tau_real_acceptance_rate"] <= 1.0
    # the last evaluation was still running when training ended: it was waited for, then logged
    assert (
        f"decode_eval: the cycle for step {last['train/tau_real_step']} ended after training" in caplog.text
    )
    result = json.loads(
        (out / "decode_eval" / f"step_{last['train/tau_real_step']}" / "result.json").read_text()
    )
    assert result["completed"] == 4 and result["accept_length"] == last["train/tau_real"]


@pytest.mark.parametrize(
    ("remote_target", "recipe_args", "says"),
    [
        ({}, {}, "set remote_target.draft_root to the folder the servers read drafts from"),
        ({"draft_root": "/elsewhere"}, {}, "which is not under remote_target.draft_root=/elsewhere"),
        (
            {"draft_root": "/"},
            {"temperature": 0.7},
            "decode_eval.temperature=0.7: the fleet evaluates greedy",
        ),
        ({"draft_root": "/"}, {"parallel_drafting": True}, "decode_eval with parallel_drafting: the fleet"),
    ],
)
def test_a_decode_eval_the_fleet_cannot_run_is_refused_before_setup(
    target, tmp_path, remote_target, recipe_args, says
):
    fleet = (argparse.Namespace(url="http://127.0.0.1:9"), tmp_path / "no-token")
    (tmp_path / "no-token").write_text("t\n")
    decode_eval = {"every_steps": 4, **{k: v for k, v in recipe_args.items() if k == "temperature"}}
    others = {k: v for k, v in recipe_args.items() if k != "temperature"}
    with pytest.raises(ValueError, match=re.escape(says)):
        recipe(tmp_path, target, fleet, remote_target, decode_eval=decode_eval, **others)
