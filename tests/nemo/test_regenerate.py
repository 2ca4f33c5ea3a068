"""NeMo 0.7.0's own regenerate.py, unchanged, against a real server's /v1 (the example's tiny target, hf
engine, CPU float32): the parquet rows it writes end with the target's greedy answer to each prompt."""

from __future__ import annotations

import asyncio
import json

import pyarrow.parquet as pq
import torch
from target_support import serve
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle3_target.server.runners.hf import HFRunner

from .nemo_support import build_target, write_chats

NEW_TOKENS = 12


def greedy_answer(model, tokenizer, prompt: list[dict]) -> str:
    """What the target's greedy generation answers: transformers' generate(do_sample=False) on the chat
    template's prompt with the generation prompt, decoded skipping special tokens."""
    text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = model.generate(ids, do_sample=False, max_new_tokens=NEW_TOKENS)
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


async def test_nemo_regenerate_writes_the_targets_greedy_answers(tmp_path):
    from nemo_automodel.components.speculative import regenerate

    model_dir = build_target(tmp_path / "target")
    chats = write_chats(tmp_path / "chats.jsonl", 6)
    out = tmp_path / "regenerated"
    async with serve(lambda: HFRunner.load(str(model_dir), dtype="float32")) as srv:
        argv = ["--input-data", str(chats), "--output-dir", str(out), "--target-server", f"{srv.url}/v1"]
        argv += ["--model", str(model_dir), "--max-new-tokens", str(NEW_TOKENS), "--shard-size", "4"]
        assert (
            await asyncio.to_thread(regenerate.main, [*argv, "--concurrency", "3", "--log-level", "WARNING"])
            == 0
        )
    rows = [row for shard in sorted(out.glob("shard-*.parquet")) for row in pq.read_table(shard).to_pylist()]
    originals = [json.loads(line)["messages"] for line in chats.read_text().splitlines()]
    assert [row["original_messages"] for row in rows] == originals
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for row, original in zip(rows, originals, strict=True):
        prompt = original[:-1]  # regenerate.py drops the trailing assistant turn
        assert row["messages"][:-1] == prompt
        assert row["messages"][-1] == {
            "role": "assistant",
            "content": greedy_answer(model, tokenizer, prompt),
        }
    assert json.loads((out / "manifest.json").read_text())["target_server"] == f"{srv.url}/v1"
