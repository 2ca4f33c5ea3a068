"""Generation on the hf engine: its tokens/s against transformers' bare generate, and training's share of the
model under a regeneration flood.

    python bench/generation.py                                  # 64 new tokens, 8 s windows, 16 flooders
    python bench/generation.py --new-tokens 64 --seconds 8 --flood 16

One `eagle3-target serve` (the embedded tiny Llama, float32, one torch thread) in a process of its own.
1. Speed: greedy /v1/completions of --new-tokens tokens, one at a time, against transformers'
   generate(do_sample=False) on the same model in this process (one torch thread too), same prompts.
   Printed: both tokens/s and their ratio (goal: at least 0.8).
2. Share: a trainer keeps two /generate batches in flight (B x S of --batch x --seq) for the window alone, then
   again while --flood clients post chat completions back to back (regenerate.py's load, at the default
   generation priority). Printed: batches/s solo and flooded, their ratio (goal: at least 0.5), and the
   flood's generated tokens/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from client_scaling import free_port, wait_healthy  # noqa: E402  (the sibling bench's helpers)

from eagle3_target.protocol import wire  # noqa: E402
from eagle3_target.server.options import EMBEDDED_MODEL  # noqa: E402
from eagle3_target.server.runners.tiny import build_tiny_llama  # noqa: E402

GENERATED = "eagle3_target_generated_tokens_total "
PROMPTS = [[1, 4, 20 + i, 30 + i, 40 + i, 6, 7] for i in range(4)]


def bare_generate(new_tokens: int, rounds: int) -> float:
    """transformers' own greedy generate on the embedded model: tokens/s over ``rounds`` passes of PROMPTS."""
    model = build_tiny_llama().float()
    model.generation_config.eos_token_id = None  # every prompt runs its full length, as max_tokens below
    tokens, start = 0, time.perf_counter()
    for _ in range(rounds):
        for prompt in PROMPTS:
            out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=new_tokens)
            tokens += out.shape[1] - len(prompt)
    return tokens / (time.perf_counter() - start)


async def served_generate(http, url: str, new_tokens: int, rounds: int) -> float:
    tokens, start = 0, time.perf_counter()
    for _ in range(rounds):
        for prompt in PROMPTS:
            body = {"model": EMBEDDED_MODEL, "prompt": prompt, "max_tokens": new_tokens, "temperature": 0}
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                tokens += (await resp.json())["usage"]["completion_tokens"]
    return tokens / (time.perf_counter() - start)


async def trainer(http, url: str, seconds: float, batch: int, seq: int) -> float:
    """/generate batches/s with two in flight, as a prefetching trainer keeps them."""
    headers = {"X-Eagle3-Session": "trainer"}
    mapping = wire.encode(
        {"selected_token_ids": torch.arange(64), "selected_token_mask": torch.arange(512) < 64}
    )
    async with http.post(f"{url}/set_vocab_mapping", data=mapping, headers=headers) as resp:
        assert resp.status == 200
    ids = torch.randint(0, 512, (batch, seq), generator=torch.Generator().manual_seed(0))
    body = wire.encode(
        {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
    )
    deadline, count = time.perf_counter() + seconds, 0

    async def lane() -> None:
        nonlocal count
        while time.perf_counter() < deadline:
            async with http.post(f"{url}/generate", data=body, headers=headers) as resp:
                await resp.read()
                assert resp.status == 200
                count += 1

    start = time.perf_counter()
    await asyncio.gather(lane(), lane())
    return count / (time.perf_counter() - start)


async def flooder(http, url: str, stop: asyncio.Event, i: int) -> None:
    messages = [{"role": "user", "content": f"w{i} w{i + 1} w{i + 2}"}]
    body = {"model": EMBEDDED_MODEL, "messages": messages, "max_tokens": 64, "temperature": 0}
    while not stop.is_set():
        async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
            await resp.read()


async def generated(http, url: str) -> float:
    """The server's generated-token counter: counted per chunk, so it moves inside a long request too."""
    async with http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(GENERATED)))


async def measure(url: str, args: argparse.Namespace) -> dict:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        await served_generate(http, url, 4, 1)  # warm
        served = await served_generate(http, url, args.new_tokens, args.rounds)
        solo = await trainer(http, url, args.seconds, args.batch, args.seq)
        stop = asyncio.Event()
        flood = [asyncio.create_task(flooder(http, url, stop, i)) for i in range(args.flood)]
        await asyncio.sleep(2.0)  # the flood is under way
        before, start = await generated(http, url), time.perf_counter()
        flooded = await trainer(http, url, args.seconds, args.batch, args.seq)
        flood_rate = (await generated(http, url) - before) / (time.perf_counter() - start)
        stop.set()
        await asyncio.gather(*flood)
    return {"served": served, "solo": solo, "flooded": flooded, "flood_tokens_per_s": flood_rate}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2, help="passes over the prompts for the speed ratio")
    p.add_argument("--seconds", type=float, default=8.0, help="each trainer window")
    p.add_argument("--flood", type=int, default=16, help="clients posting chat completions back to back")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    args = p.parse_args()
    torch.set_num_threads(1)
    port = free_port("127.0.0.1")
    cmd = [sys.executable, "-m", "eagle3_target.cli", "--log-level", "WARNING", "serve", "--port", str(port)]
    server = subprocess.Popen([*cmd, "--host", "127.0.0.1"], env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        bare_generate(4, 1)  # warm
        bare = bare_generate(args.new_tokens, args.rounds)
        result = asyncio.run(measure(url, args))
    finally:
        server.terminate()
        server.wait(30)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}")
    print(
        f"generate tokens/s: bare {bare:.1f}, served {result['served']:.1f}, ratio {result['served'] / bare:.2f}"
    )
    print(
        f"trainer batches/s: solo {result['solo']:.2f}, under a flood of {args.flood} "
        f"{result['flooded']:.2f}, ratio {result['flooded'] / result['solo']:.2f}; "
        f"flood {result['flood_tokens_per_s']:.1f} generated tokens/s"
    )
    print(json.dumps({"bare": bare, **result, "args": vars(args)}))


if __name__ == "__main__":
    main()
