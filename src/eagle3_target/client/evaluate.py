"""`eagle3-target evaluate`'s work: a draft's acceptance measured by the fleet's speculative decoding.

Each prompt of a jsonl of `messages` (a trailing assistant turn dropped, as NeMo's regenerate.py drops it) goes to
one server's POST /v1/speculative/evaluate (docs/evaluate.md) in turn; the server reads the draft from the path
given, under its --draft-dir-root. The counts of every prompt add up to the acceptance length (tokens per target
step), the per-position acceptance rates and tokens/s.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from eagle3_target.exits import CommandError, Exit
from eagle3_target.protocol import contract

from .endpoints import EndpointError, EndpointResolver, make_resolver, parse_specs
from .limits import new_session

HEALTH_POLL = 0.5  # seconds between /health polls while the server loads


def read_prompts(path: Path) -> list[list[dict[str, Any]]]:
    """The prompt of each row: its messages up to the last turn that is not the assistant's; rows left with no
    user turn are skipped (regenerate.py's rule)."""
    prompts = []
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise CommandError(f"--data {path}: {exc.strerror or exc}", Exit.USAGE) from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            messages = json.loads(line)["messages"]
        except (ValueError, KeyError, TypeError):
            raise CommandError(
                f"--data {path}:{number}: not a JSON object with 'messages'", Exit.USAGE
            ) from None
        if not isinstance(messages, list):
            raise CommandError(f"--data {path}:{number}: 'messages' is not a list", Exit.USAGE)
        end = len(messages)
        while end and isinstance(messages[end - 1], dict) and messages[end - 1].get("role") == "assistant":
            end -= 1
        if any(isinstance(m, dict) and m.get("role") == "user" for m in messages[:end]):
            prompts.append(messages[:end])
    if not prompts:
        raise CommandError(f"--data {path}: no row has a user turn to prompt with", Exit.USAGE)
    return prompts


async def find_server(spec: str, headers: dict[str, str], wait: float) -> str:
    """The first server of ``spec`` whose /health answers 200 within ``wait`` seconds; else UNREACHABLE."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    try:
        resolver = EndpointResolver(parse_specs(spec), make_resolver())
        urls = await resolver.resolve_until(deadline)
    except EndpointError as exc:
        raise CommandError(str(exc), Exit.UNREACHABLE) from None
    last = "no answer"
    async with new_session(headers=headers, timeout=aiohttp.ClientTimeout(total=5)) as http:
        while True:
            for url in urls:
                try:
                    async with http.get(f"{url}/{contract.HEALTH}") as resp:
                        if resp.status == 200:
                            return url
                        last = f"{url}: HTTP {resp.status}"
                except (aiohttp.ClientError, TimeoutError) as exc:
                    last = f"{url}: {type(exc).__name__}: {exc}"[:200]
            if loop.time() >= deadline:
                raise CommandError(
                    f"no target server ready within {wait:.0f}s; last: {last}", Exit.UNREACHABLE
                )
            await asyncio.sleep(HEALTH_POLL)


async def evaluate(
    url: str, headers: dict[str, str], prompts: list, request: dict[str, Any]
) -> dict[str, Any]:
    """Every prompt through the server's speculative decoding, one request each; the summed report."""
    results: list[dict[str, Any]] = []
    start = time.perf_counter()
    async with new_session(headers=headers, timeout=aiohttp.ClientTimeout(total=None)) as http:
        for messages in prompts:
            status = 0
            body = {**request, "prompts": [{"messages": messages}]}
            try:
                async with http.post(url + contract.SPECULATIVE_EVALUATE, json=body) as resp:
                    status = resp.status
                    reply = await resp.json(content_type=None)
            except aiohttp.ClientError as exc:
                raise CommandError(f"{url}: {type(exc).__name__}: {exc}"[:300], Exit.UNREACHABLE) from None
            except ValueError:
                raise CommandError(f"{url}: HTTP {status}, a reply that is not JSON", Exit.FAILED) from None
            if status != 200:
                raise CommandError(f"{url} refused: HTTP {status} {_said(reply)}", _exit_for(status))
            results.extend(reply["results"])
    return summarize(results, request["num_speculative_tokens"], time.perf_counter() - start)


def summarize(results: list[dict[str, Any]], k: int, seconds: float) -> dict[str, Any]:
    steps = sum(len(r["accepted_per_step"]) for r in results)
    tokens = sum(len(r["output_ids"]) for r in results)
    return {
        "num_speculative_tokens": k,
        "prompts": len(results),
        "steps": steps,
        "acceptance_length": sum(sum(r["accepted_per_step"]) for r in results) / steps if steps else 1.0,
        "acceptance_rates": [
            sum(r["accepted_per_position"][j] for r in results) / max(steps, 1) for j in range(k)
        ],
        "output_tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds if seconds else 0.0,
        "output_ids": [r["output_ids"] for r in results],
    }


def _said(reply: Any) -> str:
    if isinstance(reply, dict) and "error" in reply:
        return f"{reply['error']}: {reply.get('detail', '')}"
    return str(reply)[:200]


def _exit_for(status: int) -> Exit:
    if status == 401:
        return Exit.UNAUTHORIZED
    return Exit.USAGE if 400 <= status < 500 else Exit.FAILED
