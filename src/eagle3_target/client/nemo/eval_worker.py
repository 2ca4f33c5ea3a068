"""A ``decode_eval:`` cycle on the fleet: ``python -m eagle3_target.client.nemo.eval_worker --config-json F
--draft DIR --step N --result-json OUT --draft-root ROOT``, launched by FleetDecodeEvalRunner (fleet_cycles.py)
with the fleet's endpoint spec (and token file) in its environment.

NeMo's own worker boots vLLM with the snapshot as its speculator and benches it; this one asks a ready server of
the fleet to run the same prompts (NeMo's prompt loader, its num_prompts, split and shuffle) through its
speculative decoding (POST /v1/speculative/evaluate, client/evaluate.py), the snapshot read from the servers'
--draft-dir-root, and writes NeMo's result JSON, the keys its recipe logs as train/tau_real.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from ..endpoints import default_spec, read_auth_token
from ..evaluate import evaluate, find_server
from ._imports import nemo_module

_eval = nemo_module("components.speculative.decode_eval")
_bench = nemo_module("components.speculative.bench_common")


def nemo_result(step: int, report: dict) -> dict:
    """The fleet's report as NeMo's bench summary: accept_length is tokens per target step (bonus token
    included), acceptance_rate the accepted share of the drafted tokens (the mean of the per-position rates)."""
    rates = report["acceptance_rates"]
    return {
        "step": step,
        "num_prompts": report["prompts"],
        "completed": report["prompts"],
        "failed": 0,
        "output_tokens": report["output_tokens"],
        "wall_clock_s": round(report["seconds"], 4),
        "output_throughput_tok_s": round(report["tokens_per_second"], 4),
        "accept_length": round(report["acceptance_length"], 4),
        "acceptance_rate": sum(rates) / len(rates) if rates else None,
        "acceptance_rates": rates,
        "num_drafts": report["steps"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="decode_eval worker: the fleet measures a draft snapshot")
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--draft", required=True, help="the snapshot folder, under --draft-root")
    parser.add_argument("--step", type=int, required=True)
    parser.add_argument("--result-json", required=True)
    parser.add_argument("--draft-root", required=True, help="the servers' --draft-dir-root, as mounted here")
    args = parser.parse_args(argv)
    with open(args.config_json) as f:
        cfg = _eval.DecodeEvalConfig(**json.load(f))
    prompts = _bench._load_prompts(_eval._bench_args(cfg, server=""))
    token = read_auth_token()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = {
        "draft": os.path.relpath(args.draft, args.draft_root),
        "num_speculative_tokens": cfg.num_speculative_tokens,
        "max_tokens": cfg.max_new_tokens,
    }

    async def run() -> dict:
        url = await find_server(default_spec(), headers, min(cfg.timeout_s, 60.0))
        print(f"decode_eval worker: {len(prompts)} prompts on {url}, draft {request['draft']}", flush=True)
        return await evaluate(url, headers, prompts, request)

    result = nemo_result(args.step, asyncio.run(run()))
    tmp = args.result_json + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, args.result_json)  # NeMo's runner reads only a whole result
    print(f"decode_eval worker: wrote {args.result_json}: {json.dumps(result)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
