"""POST /v1/speculative/evaluate on a vllm replica (a real `serve --engine vllm` process): vLLM's own EAGLE-3
speculative decoding, in an evaluation engine of its own, gives the target's greedy tokens (transformers'
generate, CPU float32) and counts that add up; a second evaluation meanwhile gets 429 while /generate keeps
serving; malformed drafts get one-line 4xx errors before any engine starts. One evaluation engine in all."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from target_support import TargetProcess, generate_body, vocab_body
from transformers import AutoModelForCausalLM

from .eagle3_draft import write_eagle3_draft
from .vllm_support import AUX_LAYER_IDS, batch, draft_vocab

ENDPOINT = "/v1/speculative/evaluate"
PROMPTS = [[1, 5, 9, 33, 7], [100, 3], [4, 8, 15, 16, 23, 42]]
K, MAX_TOKENS = 3, 24
STARTING = "evaluation engine starting"  # the server's log line once an evaluation holds the replica


@pytest.fixture(scope="module")
def lab(tmp_path_factory, vllm_model_dir):
    drafts = tmp_path_factory.mktemp("drafts")
    write_eagle3_draft(Path(vllm_model_dir), drafts / "run" / "epoch_0_step_3", copying=True)
    _malformed(Path(vllm_model_dir), drafts)
    args = [
        "--engine",
        "vllm",
        "--model",
        vllm_model_dir,
        "--dtype",
        "float32",
        "--draft-dir-root",
        str(drafts),
    ]
    server = TargetProcess("127.0.0.1", *args, "--aux-layer-ids", ",".join(map(str, AUX_LAYER_IDS)))
    try:
        server.wait_ready(timeout=300)
        yield server, vllm_model_dir
    finally:
        server.process.kill()


def _malformed(target, drafts) -> None:
    """Drafts wrong in the ways vLLM would take silently or fail on deep in its start."""
    for name in ("config", "parallel", "fc", "layers", "vocab"):
        write_eagle3_draft(target, drafts / name)

    def folder(name: str) -> Path:
        return drafts / name / "model" / "consolidated"

    (folder("config") / "config.json").write_text("{not json")
    config = json.loads((folder("parallel") / "config.json").read_text())
    (folder("parallel") / "config.json").write_text(json.dumps({**config, "parallel_drafting": True}))
    (folder("vocab") / "config.json").write_text(json.dumps({**config, "vocab_size": 256}))
    for name, change in (("fc", _wide_fc), ("layers", _second_layer_only)):
        tensors = load_file(folder(name) / "model.safetensors")
        save_file(change(tensors), folder(name) / "model.safetensors")


def _wide_fc(tensors: dict) -> dict:
    return {**tensors, "model.fc.weight": torch.zeros(64, 4 * 64)}


def _second_layer_only(tensors: dict) -> dict:
    return {k.replace("layers.0.", "layers.1."): v for k, v in tensors.items()}


def post(url: str, body, path: str = ENDPOINT, headers: dict | None = None) -> tuple[int, dict | bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=600) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if path == ENDPOINT else raw
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def supervises(url: str) -> bool:
    """A /generate batch answered (the serving engine's capture), under a session with a vocab mapping."""
    session = {"X-Eagle3-Session": "trainer"}
    vocab = draft_vocab(64, seed=1)
    mapped = post(
        url, vocab_body(vocab.selected_token_ids, vocab.selected_token_mask), "/set_vocab_mapping", session
    )
    ids, mask, loss = batch(2, 12, [12, 7], seed=1)
    return mapped[0] == 200 and post(url, generate_body(ids, mask, loss), "/generate", session)[0] == 200


def greedy(model_dir: str, prompt: list[int]) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_TOKENS)
    return out[0, len(prompt) :].tolist()


def test_vllm_speculative_decoding_is_lossless_and_one_evaluation_runs_at_a_time(lab):
    server, model_dir = lab
    asked = {"draft": "run", "num_speculative_tokens": K, "max_tokens": MAX_TOKENS}
    asked["prompts"] = [{"input_ids": p} for p in PROMPTS]
    got = {}
    first = threading.Thread(target=lambda: got.update(reply=post(server.url, asked)))
    first.start()
    deadline = time.monotonic() + 60
    while STARTING not in server._logs():
        assert time.monotonic() < deadline and first.is_alive(), server._logs()[-2000:]
        time.sleep(0.05)
    second = post(server.url, asked)
    assert second[0] == 429 and second[1]["error"] == "evaluation_busy", second
    assert supervises(server.url)  # the serving engine keeps serving beside the evaluation engine
    first.join(timeout=600)
    status, reply = got["reply"]
    assert status == 200, reply
    assert reply["draft"] == "run/epoch_0_step_3/model/consolidated"
    steps = 0
    for prompt, result in zip(PROMPTS, reply["results"], strict=True):
        assert result["output_ids"] == greedy(model_dir, prompt)  # lossless, whatever the draft proposed
        per_step, per_position = result["accepted_per_step"], result["accepted_per_position"]
        assert all(1 <= n <= K + 1 for n in per_step) and len(per_position) == K
        assert sum(per_position) == sum(per_step) - len(per_step)  # accepted proposals, counted both ways
        assert per_position == [sum(n > j + 1 for n in per_step) for j in range(K)]  # a prefix is accepted
        steps += len(per_step)
    assert reply["steps"] == steps
    assert reply["acceptance_length"] == pytest.approx(1 + sum(reply["acceptance_rates"]))
    assert reply["acceptance_length"] > 1.5  # the copying draft's proposals are taken on a repeating target
    assert reply["tokens_per_second"] > 0


@pytest.mark.parametrize(
    ("draft", "status", "error"),
    [
        ("config", 400, "invalid_draft_config"),
        ("parallel", 400, "draft_not_supported"),
        ("fc", 400, "draft_weights_mismatch"),
        ("layers", 400, "draft_weights_mismatch"),
        ("vocab", 422, "draft_mismatch"),
        ("nowhere", 400, "draft_not_found"),
        ("../..", 403, "draft_outside_root"),
    ],
)
def test_a_malformed_draft_gets_a_one_line_error_and_the_replica_keeps_serving(lab, draft, status, error):
    server, _ = lab
    asked = {"draft": draft, "num_speculative_tokens": K, "max_tokens": 4, "prompts": [{"input_ids": [1, 2]}]}
    got, reply = post(server.url, asked)
    assert (got, reply["error"]) == (status, error), reply
    assert "\n" not in reply["detail"]
    assert supervises(server.url)
