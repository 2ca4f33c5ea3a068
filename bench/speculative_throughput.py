"""Speculative decoding against plain greedy decoding: output tokens/s of the same prompts through one HF server.

Both go through POST /v1/speculative/evaluate: K = --k draft tokens per target step with an EAGLE-3 draft, and
K = 0, the same server's greedy loop with a KV cache and no draft (the baseline), interleaved --repeats times;
the result is the speculative/greedy ratio of tokens/s, both measured in this run, and the outputs must be equal
(speculative decoding is lossless at temperature 0). The target is the embedded tiny Llama's shape, saved to a
temporary folder, with random prompts; the draft is a NeMo EAGLE-3 draft with random weights, whose acceptance
is near 1 token per step: then the ratio is the loop's overhead, not a draft's speed-up. A trained draft is
measured with --target (its target's folder), --draft (what `train-draft` wrote) and --data (a jsonl of
`messages`, each prompt's trailing assistant turn dropped).

    python bench/speculative_throughput.py
    python bench/speculative_throughput.py --target target --draft run/checkpoints --data conversations.jsonl
    python bench/speculative_throughput.py --smoke    # a seconds-long run at a small shape (the smoke test's)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import torch

from eagle3_target.server.runners.tiny import build_tiny_llama


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def random_draft(target: Path, out: Path) -> None:
    """NeMo's EAGLE-3 draft for ``target``, configured as its recipe does, random weights, saved as it saves one."""
    from nemo_automodel.components.speculative.decode_eval import export_draft_snapshot
    from nemo_automodel.components.speculative.eagle.draft_llama import LlamaEagle3DraftModel
    from transformers import AutoConfig

    base = AutoConfig.from_pretrained(target)
    config = {**base.to_dict(), "draft_vocab_size": base.vocab_size, "target_hidden_size": base.hidden_size}
    config.update(
        architectures=["LlamaEagle3DraftModel"], tie_word_embeddings=False, attn_implementation="eager"
    )
    torch.manual_seed(0)
    export_draft_snapshot(LlamaEagle3DraftModel(type(base).from_dict(config)), str(out))


@contextlib.contextmanager
def hf_server(model_dir: Path, drafts: Path, threads: int) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "eagle3_target.cli", "--log-level", "WARNING", "serve", "--engine", "hf"]
    cmd += [
        "--model",
        str(model_dir),
        "--draft-dir-root",
        str(drafts),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server at {url} did not come up")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def chat_prompts(path: Path, count: int) -> list[dict]:
    """The first ``count`` rows' messages up to their last turn that is not the assistant's."""
    prompts = []
    for line in path.read_text().splitlines()[:count]:
        messages = json.loads(line)["messages"]
        while messages and messages[-1]["role"] == "assistant":
            messages = messages[:-1]
        prompts.append({"messages": messages})
    return prompts


def evaluate(url: str, prompts: list[dict], k: int, max_tokens: int) -> tuple[float, dict]:
    """Client-side seconds and the reply of one request with every prompt."""
    body = {"draft": "draft", "num_speculative_tokens": k, "max_tokens": max_tokens, "prompts": prompts}
    request = urllib.request.Request(url + "/v1/speculative/evaluate", data=json.dumps(body).encode())
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=3600) as resp:
            reply = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"the server refused: HTTP {exc.code} {exc.read().decode()}") from None
    return time.perf_counter() - start, reply


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--target", type=Path, help="the target's folder (default: the embedded tiny Llama's shape)"
    )
    p.add_argument(
        "--draft", type=Path, help="a draft checkpoint (dir) for --target (default: random weights)"
    )
    p.add_argument("--data", type=Path, help="a jsonl of messages to prompt with (default: random token ids)")
    p.add_argument("--k", type=int, default=3, help="draft tokens per target step")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="the server's OMP_NUM_THREADS")
    p.add_argument("--smoke", action="store_true", help="a small, fast shape: 2 prompts of 16, 8 new tokens")
    args = p.parse_args()
    if args.smoke:
        args.prompts, args.prompt_tokens, args.max_tokens, args.repeats = 2, 16, 8, 1
    model = build_tiny_llama(seed=1)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(
        0, model.config.vocab_size, (args.prompts, args.prompt_tokens), generator=gen
    ).tolist()
    prompts = chat_prompts(args.data, args.prompts) if args.data else [{"input_ids": p} for p in ids]
    source = f"from {args.data}" if args.data else f"of {args.prompt_tokens} random tokens"
    print(
        f"torch {torch.__version__}, server threads {args.threads}; {len(prompts)} prompts {source}, "
        f"{args.max_tokens} new tokens each, K={args.k}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        target, drafts = args.target or Path(tmp) / "target", Path(tmp) / "drafts"
        if args.target is None:
            model.save_pretrained(target)
        if args.draft is None:
            random_draft(target, drafts / "draft")
        else:
            shutil.copytree(args.draft, drafts / "draft")
        with hf_server(target, drafts, args.threads) as url:
            evaluate(url, prompts[:1], args.k, 2)  # warm-up: loads the draft
            seconds: dict[int, list[float]] = {0: [], args.k: []}
            replies = {}
            for _ in range(args.repeats):
                for k in seconds:
                    elapsed, replies[k] = evaluate(url, prompts, k, args.max_tokens)
                    seconds[k].append(elapsed)
    outputs = {k: [r["output_ids"] for r in reply["results"]] for k, reply in replies.items()}
    assert outputs[0] == outputs[args.k], "speculative decoding must give the greedy tokens"
    print(f"{'mode':12}{'K':>3}{'tokens':>8}{'steps':>7}{'accept len':>12}{'median s':>10}{'tok/s':>9}")
    rate = {}
    for k, reply in replies.items():
        rate[k] = reply["output_tokens"] / statistics.median(seconds[k])
        name = "greedy" if k == 0 else "speculative"
        print(
            f"{name:12}{k:>3}{reply['output_tokens']:>8}{reply['steps']:>7}{reply['acceptance_length']:>12.3f}"
            f"{statistics.median(seconds[k]):>10.2f}{rate[k]:>9.1f}"
        )
    print(f"accepted per position: {' '.join(f'{r:.3f}' for r in replies[args.k]['acceptance_rates'])}")
    print(f"speculative/greedy tokens/s: {rate[args.k] / rate[0]:.2f}x")


if __name__ == "__main__":
    main()
