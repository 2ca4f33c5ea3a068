"""The evaluation engine of a vllm replica: a process of its own that builds vLLM's LLM over the replica's
target with vLLM's EAGLE-3 speculative decoding and the exported draft (vllm_draft.py), decodes each prompt
greedily, and writes what each step gave (vllm_evaluate.py starts it: ``python -m ... JOB OUT``).

A prompt runs alone, one engine step at a time: after its prefill each step is one target forward verifying
the draft's K proposals, and the tokens it adds are 1 + the proposals accepted. vLLM cuts the last step's
tokens at max_tokens or end of sequence, so the steps' own counts come from vLLM's spec-decode counters
(``get_metrics``): the last step gets what the counters have beyond the others. K = 0 builds the engine
without a draft: plain greedy decoding, one token a step.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

DRAFTS, ACCEPTED, PER_POSITION = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos",
)


def counters(llm, k: int) -> tuple[int, int, list[int]]:
    """vLLM's spec-decode counters so far: drafts (verify steps), accepted tokens, accepted per position."""
    drafts, accepted, per_position = 0, 0, [0] * k
    for metric in llm.get_metrics():
        if metric.name == DRAFTS:
            drafts += int(metric.value)
        elif metric.name == ACCEPTED:
            accepted += int(metric.value)
        elif metric.name == PER_POSITION:
            for j, value in enumerate(metric.values[:k]):
                per_position[j] += int(value)
    return drafts, accepted, per_position


def decode(llm, prompt: list[int], params, k: int, name: str) -> dict:
    """One prompt decoded alone, step by step: its tokens and each verify step's count."""
    before = counters(llm, k) if k else None
    engine = llm.llm_engine
    engine.add_request(name, {"prompt_token_ids": prompt}, params)
    gained, seen = [], 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens = len(out.outputs[0].token_ids)
            if tokens > seen:
                gained.append(tokens - seen)
                seen = tokens
            output = list(out.outputs[0].token_ids)
    per_step = gained[1:]  # the prefill's token is no step
    if not k:
        return {"output_ids": output, "accepted_per_step": per_step, "accepted_per_position": []}
    after = counters(llm, k)
    drafts, accepted = after[0] - before[0], after[1] - before[1]
    per_position = [a - b for a, b in zip(after[2], before[2], strict=True)]
    if drafts != len(per_step):
        raise RuntimeError(f"vLLM counted {drafts} verify steps, the engine ran {len(per_step)}")
    if per_step:  # the last step as counted, before vLLM cut its tokens
        per_step[-1] = drafts + accepted - sum(per_step[:-1])
    return {"output_ids": output, "accepted_per_step": per_step, "accepted_per_position": per_position}


def run(job: dict) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core here: step() drives it
    from vllm import LLM, SamplingParams

    k = job["num_speculative_tokens"]
    args = dict(job["engine"], disable_log_stats=False)
    if k:
        args["speculative_config"] = {"method": "eagle3", "model": job["draft"], "num_speculative_tokens": k}
    try:
        llm = LLM(**args)
    except Exception as exc:  # the draft vLLM could not build or load: the request's fault, said in one line
        return {"error": "draft_not_loadable", "detail": f"vLLM refused the draft: {exc}"[:300]}
    params = SamplingParams(
        max_tokens=job["max_tokens"], temperature=0.0, stop_token_ids=job["stop_token_ids"], detokenize=False
    )
    start = time.perf_counter()
    results = [decode(llm, prompt, params, k, str(i)) for i, prompt in enumerate(job["prompts"])]
    return {"results": results, "seconds": time.perf_counter() - start}


def main(argv: list[str]) -> int:
    from ..lifeline import exit_with_parent

    exit_with_parent()
    job, out = json.loads(Path(argv[0]).read_text()), Path(argv[1])
    out.write_text(json.dumps(run(job)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
