"""Speculative decoding on a vllm replica: vLLM's own EAGLE-3, in an evaluation engine of its own.

vLLM fixes its speculative config when an engine is built, and one process holds one vLLM engine (its process
groups are global: runners/vllm.py), so the serving engine cannot take a draft and a second engine cannot live
beside it in the server's process. Each evaluation therefore starts a process (vllm_child.py) that builds vLLM's
LLM over the replica's own target (the same checkpoint and engine arguments: a second copy of its weights in
memory while it runs) with the draft exported for vLLM (vllm_draft.py), decodes the prompts and exits. The
serving engine keeps serving meanwhile; one evaluation runs at a time per replica (429 for another).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import InvalidInput, QueueFull, TooLarge
from . import vllm_draft

log = logging.getLogger(__name__)

CHILD = "eagle3_target.server.speculative.vllm_child"
GPU_MEMORY_CEILING = 0.9  # the evaluation engine takes what the serving engine leaves of a GPU, up to this
MIN_GPU_MEMORY = 0.05
RETRY_AFTER = 60  # seconds a second evaluation is asked to wait


class VLLMEvaluation:
    """One evaluation engine at a time for this replica's vllm runner."""

    def __init__(self):
        self._busy = False

    async def run(
        self, runner: Any, folder: Path | None, k: int, prompts: list[list[int]], max_tokens: int
    ) -> tuple[list[dict[str, Any]], float]:
        """Each prompt's ``output_ids``, ``accepted_per_step`` and ``accepted_per_position``, and the seconds
        the decoding took (the evaluation engine's start not counted)."""
        check_runner(runner)
        longest = max(map(len, prompts)) + max_tokens + k
        if longest > runner.max_model_len:
            raise TooLarge(
                "prompt_too_long",
                f"a prompt plus max_tokens and K is {longest} tokens, over the engine's max_model_len "
                f"{runner.max_model_len}",
            )
        if self._busy:
            raise QueueFull(
                "evaluation_busy",
                "this vllm replica runs one evaluation at a time (each starts an engine of its own): retry later",
                RETRY_AFTER,
            )
        self._busy = True
        log.info("evaluation engine starting: %d prompts, K=%d, draft %s", len(prompts), k, folder)
        try:
            with tempfile.TemporaryDirectory(prefix="eagle3-evaluate-") as tmp:
                draft = None
                if k:
                    draft = await asyncio.to_thread(
                        vllm_draft.export, folder, runner.info, Path(tmp, "draft")
                    )
                job = {
                    "engine": evaluation_engine_args(runner.engine_args),
                    "draft": None if draft is None else str(draft),
                    "num_speculative_tokens": k,
                    "prompts": prompts,
                    "max_tokens": max_tokens,
                    "stop_token_ids": sorted(await asyncio.to_thread(eos_ids, runner.info.model)),
                }
                reply = await _child(job, Path(tmp))
        finally:
            self._busy = False
        if "error" in reply:
            raise InvalidInput(reply["error"], reply["detail"])
        return reply["results"], reply["seconds"]


def check_runner(runner: Any) -> None:
    """What the evaluation engine can copy: a one-device text replica serving the weights it started with."""
    if runner.info.parallel or runner.info.modalities:
        raise InvalidInput(
            "speculative_not_offered",
            "a vllm replica evaluates drafts on one device, text only (its evaluation engine is a copy of it)",
        )
    if getattr(runner, "refreshed", False):
        raise InvalidInput(
            "speculative_not_offered",
            "this vllm replica's weights were refreshed in place; its evaluation engine would load the "
            "checkpoint it started from, so it evaluates no drafts until it is restarted",
        )


def evaluation_engine_args(serving: dict[str, Any]) -> dict[str, Any]:
    """The serving engine's arguments, on a GPU with the memory the serving engine leaves."""
    args = dict(serving)
    if args.get("device_ids") is not None:
        left = GPU_MEMORY_CEILING - float(args["gpu_memory_utilization"])
        args["gpu_memory_utilization"] = round(max(left, MIN_GPU_MEMORY), 3)
    return args


def eos_ids(model: str) -> set[int]:
    """The end-of-sequence ids generate() stops at: the model's generation config's, else its config's."""
    from transformers import AutoConfig, GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model).eos_token_id
    except OSError:
        config = AutoConfig.from_pretrained(model)
        eos = getattr(config.get_text_config(), "eos_token_id", None)
    return set() if eos is None else {eos} if isinstance(eos, int) else set(eos)


async def _child(job: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """Run the evaluation engine on ``job``; its reply, or RuntimeError (a 500) if it died without one."""
    (tmp / "job.json").write_text(json.dumps(job))
    out = tmp / "reply.json"
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", CHILD, str(tmp / "job.json"), str(out))
    try:
        code = await proc.wait()
    finally:
        if proc.returncode is None:  # the request was cancelled: so is its engine
            proc.kill()
            await proc.wait()
    if code or not out.is_file():
        raise RuntimeError(f"the evaluation engine exited with code {code} before it answered (see the log)")
    return json.loads(out.read_text())
