"""POST /v1/speculative/evaluate without the HTTP: validate the request, load the draft, run each prompt's
draft-then-verify loop one step per turn at the model, at a low priority class by default, so training's
/generate keeps its share (scheduler.py). On the vllm engine vLLM's own EAGLE-3 decodes instead, in an
evaluation engine of its own (vllm_evaluate.py). The request's JSON and the reply's are in docs/evaluate.md.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from ..errors import InvalidInput, OutOfRange, TooLarge
from ..model_host import ModelHost
from ..options import ServerOptions
from ..runners.hf import HFRunner
from ..scheduler import FairScheduler, priority_class
from . import drafts
from .decode import Decoding
from .vllm_evaluate import VLLMEvaluation

DEFAULT_PRIORITY = "low"  # evaluation yields to training's /generate while both wait
MAX_SPECULATIVE_TOKENS = 32
MAX_TOKENS = 4096  # new tokens per prompt
MAX_PROMPTS = 256


class SpeculativeEvaluator:
    """Speculative decoding of prompts with a draft read from --draft-dir-root: the `hf` engine's loop here,
    the `vllm` engine's own in an evaluation engine (vllm_evaluate.py)."""

    def __init__(self, model: ModelHost, turns: FairScheduler, options: ServerOptions):
        self.model, self.turns, self.options = model, turns, options
        self.root = Path(options.draft_dir_root) if options.draft_dir_root else None
        self.drafts = drafts.DraftCache()
        self.vllm = VLLMEvaluation()
        self._tokenizer: Any = None

    async def evaluate(self, session: str, body: bytes) -> dict[str, Any]:
        runner = self.model.ready()
        asked = _parse(body)
        k = _int(asked, "num_speculative_tokens", 0, MAX_SPECULATIVE_TOKENS)
        # K = 0 is plain greedy decoding through the same loop: the baseline, which needs no draft
        folder = drafts.resolve(self.root, asked.get("draft")) if k or "draft" in asked else None
        max_tokens = _int(asked, "max_tokens", 1, MAX_TOKENS)
        priority = asked.get("priority", DEFAULT_PRIORITY)
        if not isinstance(priority, str):
            raise InvalidInput("invalid_field", "'priority' must be one of low, normal, high")
        priority = priority_class(priority, self.options.max_priority)
        vllm = _check_engine(runner)
        prompts = [await self._prompt(runner, p, max_tokens + k) for p in _prompts(asked)]
        name = None if folder is None else str(folder.relative_to(self.root.resolve()))
        if vllm:  # vLLM's own speculative decoding, in an engine of its own (vllm_evaluate.py)
            results, seconds = await self.vllm.run(runner, folder, k, prompts, max_tokens)
            return _summary(name, k, results, seconds)
        draft = await asyncio.to_thread(self.drafts.get, folder, runner.info) if folder else None
        eos = _eos(runner)
        start, results = time.perf_counter(), []
        for prompt in prompts:
            decoding = Decoding(runner, draft if k else None, prompt, k, max_tokens, eos)
            async with self.turns.turn(session, len(prompt), priority):
                await self.model.call(decoding.prefill)
            while not decoding.done:
                async with self.turns.turn(session, k + 1, priority):
                    await self.model.call(decoding.step)
            results.append(
                {
                    "prompt_tokens": len(prompt),
                    "output_ids": decoding.output,
                    "accepted_per_step": decoding.accepted,
                    "accepted_per_position": decoding.per_position,
                }
            )
        return _summary(name, k, results, time.perf_counter() - start)

    async def _prompt(self, runner: HFRunner, prompt: Any, room: int) -> list[int]:
        """A prompt's token ids: given as input_ids, or its messages through the target's chat template."""
        if not isinstance(prompt, dict) or len(prompt.keys() & {"input_ids", "messages"}) != 1:
            raise InvalidInput(
                "invalid_prompt", "each prompt is an object with either 'input_ids' or 'messages'"
            )
        if "messages" in prompt:
            ids = await asyncio.to_thread(self._chat, runner, prompt["messages"])
        else:
            ids = prompt["input_ids"]
            if not (isinstance(ids, list) and ids and all(type(i) is int for i in ids)):
                raise InvalidInput("invalid_prompt", "'input_ids' must be a non-empty list of integers")
            if not all(0 <= i < runner.info.vocab_size for i in ids):
                raise OutOfRange("token_out_of_range", f"input_ids must be in [0, {runner.info.vocab_size})")
        if len(ids) + room > self.options.max_batch_tokens:
            raise TooLarge(
                "prompt_too_long",
                f"a prompt of {len(ids)} tokens plus max_tokens and K passes --max-batch-tokens "
                f"{self.options.max_batch_tokens}",
            )
        return ids

    def _chat(self, runner: HFRunner, messages: Any) -> list[int]:
        """As vLLM's chat endpoint: the chat template with the generation prompt, tokenized as it stands."""
        if not (isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages)):
            raise InvalidInput("invalid_prompt", "'messages' must be a non-empty list of objects")
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            try:
                self._tokenizer = AutoTokenizer.from_pretrained(runner.info.model)
            except (OSError, ValueError):
                raise InvalidInput(
                    "no_tokenizer", f"the target {runner.info.model!r} has no tokenizer here: send input_ids"
                ) from None
        try:
            text = self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # the template's own error (a missing role, no template at all)
            raise InvalidInput(
                "invalid_messages", f"the chat template refused the messages: {exc}"[:300]
            ) from None
        return self._tokenizer(text, add_special_tokens=False)["input_ids"]


def _parse(body: bytes) -> dict[str, Any]:
    try:
        asked = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput("invalid_json", f"the body is not JSON: {exc}") from None
    if not isinstance(asked, dict):
        raise InvalidInput("invalid_json", "the body must be a JSON object")
    return asked


def _int(asked: dict[str, Any], name: str, low: int, high: int) -> int:
    value = asked.get(name)
    if type(value) is not int:
        raise InvalidInput("invalid_field", f"{name!r} must be an integer")
    if not low <= value <= high:
        raise (TooLarge if value > high else InvalidInput)(
            "invalid_field", f"{name!r} must be in [{low}, {high}]"
        )
    return value


def _prompts(asked: dict[str, Any]) -> list[Any]:
    prompts = asked.get("prompts")
    if not isinstance(prompts, list) or not prompts:
        raise InvalidInput("invalid_field", "'prompts' must be a non-empty list")
    if len(prompts) > MAX_PROMPTS:
        raise TooLarge("too_many_prompts", f"at most {MAX_PROMPTS} prompts per request, not {len(prompts)}")
    return prompts


def _check_engine(runner: Any) -> bool:
    """True for the vllm engine (its own speculative decoding), False for a one-device hf text target."""
    if runner.info.engine == "vllm":
        return True
    if type(runner) is not HFRunner or runner.info.modalities:
        raise InvalidInput(
            "speculative_not_offered",
            f"speculative decoding runs on the vllm engine or a one-device text target of the hf engine, not "
            f"{runner.info.engine} ({type(runner).__name__})",
        )
    return False


def _eos(runner: HFRunner) -> set[int]:
    eos = getattr(getattr(runner.model, "generation_config", None), "eos_token_id", None)
    return set() if eos is None else {eos} if isinstance(eos, int) else set(eos)


def _summary(draft: str | None, k: int, results: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    steps = sum(len(r["accepted_per_step"]) for r in results)
    accepted = [sum(r["accepted_per_position"][j] for r in results) for j in range(k)]
    output_tokens = sum(len(r["output_ids"]) for r in results)
    return {
        "draft": draft,
        "num_speculative_tokens": k,
        "results": results,
        "steps": steps,
        "acceptance_length": sum(sum(r["accepted_per_step"]) for r in results) / steps if steps else 1.0,
        "acceptance_rates": [a / steps if steps else 0.0 for a in accepted],
        "output_tokens": output_tokens,
        "seconds": seconds,
        "tokens_per_second": output_tokens / seconds if seconds else 0.0,
    }
