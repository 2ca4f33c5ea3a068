"""POST /v1/speculative/evaluate and `eagle3-target evaluate` against a real `serve` process of the tiny target:
at temperature 0 speculative decoding gives the target's own greedy tokens (transformers' generate, CPU float32),
with any draft; the counts add up; bad input gets one-line 4xx errors and the server keeps serving."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
import torch
from nemo.nemo_support import make_data
from speculative.draft_support import chat_ids, greedy, write_draft
from target_support import TargetProcess, samples, serve
from transformers import AutoModelForCausalLM
from vllm_engine.eagle3_draft import write_eagle3_draft

from eagle3_target.server.options import ServerOptions
from eagle3_target.server.runners.hf import HFRunner
from eagle3_target.server.runners.synthetic import SyntheticRunner
from eagle3_target.server.speculative.decode import Decoding
from eagle3_target.server.speculative.drafts import Draft

ENDPOINT = "/v1/speculative/evaluate"
PROMPTS = [[1, 5, 9, 33, 7], [4, 8, 15, 16, 23, 42], [100, 3]]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("speculative")
    words = make_data.write_target(root / "target")
    make_data.write_conversations(root / "chats.jsonl", words, 3, seed=5)
    checkpoints = root / "drafts" / "run" / "checkpoints"
    write_draft(root / "target", checkpoints / "epoch_0_step_2", seed=1)
    write_draft(
        root / "target", checkpoints / "epoch_0_step_4", seed=0, sharded=True
    )  # the newest: the one evaluated
    write_draft(root / "target", root / "drafts" / "wide", target_hidden_size=32)
    # proposes the target's last token again: some proposals accepted (vllm_engine/eagle3_draft.py)
    write_eagle3_draft(root / "target", root / "drafts" / "copying", copying=True)
    server = TargetProcess(
        "127.0.0.1",
        "--engine",
        "hf",
        "--model",
        str(root / "target"),
        "--draft-dir-root",
        str(root / "drafts"),
    ).wait_ready(timeout=300)
    model = AutoModelForCausalLM.from_pretrained(root / "target", dtype=torch.float32).eval()
    try:
        yield root, server, model
    finally:
        server.kill()


def post(url: str, body) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + ENDPOINT, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


SPECULATIVE = "eagle3_target_speculative_"


def test_speculative_decoding_gives_the_target_greedy_tokens(lab):
    _, server, model = lab
    asked = {"draft": "run/checkpoints", "prompts": [{"input_ids": p} for p in PROMPTS], "max_tokens": 24}
    status, reply = post(server.url, {**asked, "num_speculative_tokens": 3})
    assert status == 200, reply
    assert reply["draft"] == "run/checkpoints/epoch_0_step_4/model/consolidated"
    for prompt, result in zip(PROMPTS, reply["results"], strict=True):
        assert result["output_ids"] == greedy(model, prompt, 24)
        assert all(1 <= n <= 4 for n in result["accepted_per_step"])
        assert len(result["accepted_per_position"]) == 3
    steps = sum(len(r["accepted_per_step"]) for r in reply["results"])
    assert reply["steps"] == steps and reply["acceptance_length"] >= 1
    baseline = post(server.url, {**asked, "num_speculative_tokens": 0})[
        1
    ]  # plain greedy through the same loop
    assert [r["output_ids"] for r in baseline["results"]] == [r["output_ids"] for r in reply["results"]]
    assert baseline["acceptance_length"] == 1


def test_the_metrics_count_each_evaluation_as_its_reply_does(lab):
    """eagle3_target_speculative_*: one done evaluation, its prompts, verify steps, K draft tokens a step, the
    accepted ones (the copying draft's, some) and the output tokens; 1 + accepted / steps is the acceptance."""
    _, server, _ = lab
    before = samples(server.url, SPECULATIVE)
    asked = {"draft": "copying", "prompts": [{"input_ids": p} for p in PROMPTS], "max_tokens": 24}
    status, reply = post(server.url, {**asked, "num_speculative_tokens": 3})
    assert status == 200, reply
    moved = {name: value - before[name] for name, value in samples(server.url, SPECULATIVE).items()}
    accepted = sum(sum(r["accepted_per_step"]) - len(r["accepted_per_step"]) for r in reply["results"])
    assert accepted > 0
    assert moved == {
        'evaluations_total{outcome="done"}': 1,
        'evaluations_total{outcome="failed"}': 0,
        "prompts_total": len(PROMPTS),
        "steps_total": reply["steps"],
        "draft_tokens_total": 3 * reply["steps"],
        "accepted_tokens_total": accepted,
        "output_tokens_total": reply["output_tokens"],
    }
    assert 1 + accepted / reply["steps"] == pytest.approx(reply["acceptance_length"])


def test_a_draft_that_proposes_right_has_every_proposal_accepted(lab):
    root, _, model = lab
    runner = HFRunner.load(str(root / "target"), dtype="float32")
    prompt, k, steps = PROMPTS[0], 3, 4
    reference = prompt + greedy(model, prompt, 1 + steps * (k + 1))
    oracle = Draft(_Oracle(reference, runner.info.vocab_size), root, None)
    decoding = Decoding(runner, oracle, prompt, k, 1 + steps * (k + 1), set())
    decoding.prefill()
    while not decoding.done:
        decoding.step()
    assert decoding.output == reference[len(prompt) :]
    assert decoding.accepted == [k + 1] * steps and decoding.per_position == [steps] * k


class _Oracle(torch.nn.Module):
    """A stand-in draft that always proposes the target's next greedy token (it reads it from ``reference``)."""

    def __init__(self, reference: list[int], vocab: int):
        super().__init__()
        self.reference, self.vocab = reference, vocab

    def project_hidden_states(self, aux):
        return torch.zeros(*aux.shape[:2], 1)

    def forward(self, input_ids, projected_hidden_states, attention_mask):
        return torch.arange(input_ids.shape[1], dtype=torch.float32).view(1, -1, 1)

    def compute_logits(self, hidden):
        # draft position i holds token i+1 and predicts token i+2
        logits = torch.zeros(1, 1, self.vocab)
        logits[0, 0, self.reference[int(hidden.item()) + 2]] = 1.0
        return logits


def test_evaluate_command_reports_acceptance_and_the_greedy_tokens(lab, tmp_path):
    root, server, model = lab
    out = tmp_path / "report.json"
    cmd = [
        sys.executable,
        "-m",
        "eagle3_target.cli",
        "evaluate",
        "--url",
        server.url,
        "--draft",
        "run/checkpoints",
        "--data",
        str(root / "chats.jsonl"),
        "--num-speculative-tokens",
        "2",
        "--max-tokens",
        "8",
        "--json",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "acceptance length" in done.stdout and "tokens/s" in done.stdout
    report = json.loads(out.read_text())
    assert report["acceptance_length"] >= 1 and len(report["acceptance_rates"]) == 2
    rows = [json.loads(line)["messages"] for line in (root / "chats.jsonl").read_text().splitlines()]
    assert all(row[-1]["role"] == "assistant" for row in rows)
    expected = [greedy(model, chat_ids(root / "target", row[:-1]), 8) for row in rows]  # the answer dropped
    assert report["output_ids"] == expected


ASK = {"draft": "run/checkpoints", "num_speculative_tokens": 2}


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        (b"{not json", 400, "invalid_json"),
        ({**ASK, "draft": "nowhere"}, 400, "draft_not_found"),
        ({**ASK, "draft": "../target"}, 403, "draft_outside_root"),
        ({**ASK, "draft": "wide"}, 422, "draft_mismatch"),
        ({**ASK, "num_speculative_tokens": 10**6}, 413, "invalid_field"),
        ({**ASK, "num_speculative_tokens": "3"}, 400, "invalid_field"),
        ({**ASK, "max_tokens": 0}, 400, "invalid_field"),
        ({**ASK, "max_tokens": 8000}, 413, "invalid_field"),
        ({**ASK, "prompts": [{"input_ids": [10**6]}]}, 422, "token_out_of_range"),
        ({**ASK, "prompts": [{"text": "hi"}]}, 400, "invalid_prompt"),
        ({**ASK, "prompts": []}, 400, "invalid_field"),
        ({**ASK, "priority": 5}, 400, "invalid_field"),
        ({**ASK, "priority": "high"}, 403, "priority_not_allowed"),
    ],
)
def test_bad_requests_get_one_line_errors(lab, body, status, error):
    _, server, _ = lab
    if isinstance(body, dict):
        body = {"prompts": [{"input_ids": PROMPTS[0]}], "max_tokens": 4, **body}
    got, reply = post(server.url, body)
    assert (got, reply["error"]) == (status, error), reply
    assert "\n" not in reply["detail"]
    assert (
        post(server.url, {"prompts": [{"input_ids": [1, 2]}], "num_speculative_tokens": 0, "max_tokens": 2})[
            0
        ]
        == 200
    )


def test_a_prompt_past_the_model_context_is_refused_with_the_numbers_before_any_work(lab):
    """As /v1 generation (tests/server/test_generation.py): prompt, max_tokens and K past the target's 4096
    positions is a 400 naming them; nothing runs (the metrics stay), and the server keeps serving."""
    _, server, _ = lab
    before = samples(server.url, SPECULATIVE)
    body = {**ASK, "prompts": [{"input_ids": PROMPTS[1]}, {"input_ids": PROMPTS[0]}], "max_tokens": 4092}
    got, reply = post(server.url, body)
    assert (got, reply["error"]) == (400, "context_length_exceeded"), reply
    assert reply["detail"] == (
        "This model's maximum context length is 4096 tokens. However, you requested 4100 tokens (6 in the "
        "prompt, 4094 in max_tokens and K). Please reduce the length of the prompt or completion."
    )
    assert samples(server.url, SPECULATIVE) == before
    assert post(server.url, {**body, "max_tokens": 4})[0] == 200


def test_evaluate_command_against_a_dead_url_ends_in_one_line(tmp_path):
    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    cmd = [
        sys.executable,
        "-m",
        "eagle3_target.cli",
        "evaluate",
        "--url",
        "http://127.0.0.1:9",
        "--draft",
        "d",
        "--data",
        str(data),
        "--num-speculative-tokens",
        "2",
        "--max-tokens",
        "4",
        "--wait",
        "1",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 4, done.stderr
    assert done.stderr.count("\n") == 1 and "no target server ready" in done.stderr


async def test_a_server_without_a_draft_root_or_on_another_engine_refuses():
    body = json.dumps(
        {"draft": "d", "prompts": [{"input_ids": [1]}], "num_speculative_tokens": 1, "max_tokens": 1}
    )
    async with serve(SyntheticRunner) as running:
        resp = await running.post(ENDPOINT.removeprefix("/"), body.encode())
        assert resp.status == 403 and (await resp.json())["error"] == "speculative_disabled"
    async with serve(SyntheticRunner, ServerOptions(draft_dir_root="/")) as running:
        zero = json.dumps({"prompts": [{"input_ids": [1]}], "num_speculative_tokens": 0, "max_tokens": 1})
        resp = await running.post(ENDPOINT.removeprefix("/"), zero.encode())
        assert resp.status == 400 and (await resp.json())["error"] == "speculative_not_offered"
