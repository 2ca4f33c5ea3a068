"""POST /v1/speculative/evaluate without the HTTP: validate the request (its prompts within the target's
context), load the draft, run the prompts' draft-then-verify loops in turns at the model, a client's
evaluations one scheduler session of their own at --generation-priority by default, so training's /generate
keeps its share (scheduler.py); counted in the eagle3_target_speculative_* metrics. On the vllm engine vLLM's
own EAGLE-3 decodes instead, in an evaluation engine of its own (vllm_evaluate.py). The request's JSON and the
reply's are in docs/evaluate.md.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from ..errors import InvalidInput, OutOfRange, ServiceError, TooLarge
from ..generation import context_exceeded, context_length
from ..metrics import ServerMetrics
from ..model_host import ModelHost
from ..options import ServerOptions
from ..runners.hf import HFRunner
from ..scheduler import FairScheduler, priority_class
from . import drafts
from .decode import Decoding
from .vllm_evaluate import VLLMEvaluation

# A client's evaluations take turns as one scheduler session of their own, apart from its /generate
TENANT_PREFIX = "evaluation:"
MAX_SPECULATIVE_TOKENS = 32
MAX_TOKENS = 4096  # new tokens per prompt
MAX_PROMPTS = 256


class SpeculativeEvaluator:
    """Speculative decoding of prompts with a draft read from --draft-dir-root: the `hf` engine's loop here,
    the `vllm` engine's own in an evaluation engine (vllm_evaluate.py)."""

    def __init__(
        self, model: ModelHost, turns: FairScheduler, options: ServerOptions, metrics: ServerMetrics
    ):
        self.model, self.turns, self.options, self.metrics = model, turns, options, metrics
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
        priority = asked.get("priority", self.options.generation.priority)
        if not isinstance(priority, str):
            raise InvalidInput("invalid_field", "'priority' must be one of low, normal, high")
        priority = priority_class(priority, self.options.max_priority)
        vllm = _check_engine(runner)
        prompts = [await self._prompt(runner, p, max_tokens + k) for p in _prompts(asked)]
        name = None if folder is None else str(folder.relative_to(self.root.resolve()))
        if vllm:  # vLLM's own speculative decoding, in an engine of its own (vllm_evaluate.py)
            return _summary(name, k, *await self._vllm(runner, folder, k, prompts, max_tokens))
        draft = await asyncio.to_thread(self.drafts.get, folder, runner.info) if folder else None
        eos = _eos(runner)
        decodings = [Decoding(runner, draft if k else None, p, k, max_tokens, eos) for p in prompts]
        start = time.perf_counter()
        await self._run(decodings, TENANT_PREFIX + session, priority, k)
        results = [
            {
                "prompt_tokens": len(d.prompt),
                "output_ids": d.output,
                "accepted_per_step": d.accepted,
                "accepted_per_position": d.per_position,
            }
            for d in decodings
        ]
        return _summary(name, k, results, time.perf_counter() - start)

    async def _run(self, decodings: list[Decoding], tenant: str, priority: str, k: int) -> None:
        """Every prompt's forwards in turns at the model, charged the model time each turn held (as a
        generation's chunks are), the metrics counted per turn."""
        forwards = max(1, self.options.generation.chunk_tokens // (k + 1))
        charge, outcome, m = len(decodings[0].prompt) + forwards, "failed", self.metrics
        try:
            while not all(d.done for d in decodings):
                async with self.turns.turn(tenant, charge, priority, by_tokens=False):
                    start = time.perf_counter()
                    steps, accepted, emitted = await self.model.call(_advance, decodings, forwards)
                    held = time.perf_counter() - start
                charge = self.turns.tokens_for(held, fallback=emitted or 1)
                m.speculative_steps.inc(steps)
                m.speculative_draft_tokens.inc(steps * k)
                m.speculative_accepted_tokens.inc(accepted)
                m.speculative_output_tokens.inc(emitted)
            m.speculative_prompts.inc(len(decodings))
            outcome = "done"
        finally:
            m.speculative_evaluations.labels(outcome).inc()

    async def _vllm(self, runner, folder: Path | None, k: int, prompts: list[list[int]], max_tokens: int):
        """vLLM's own speculative decoding (its results and seconds), counted in the metrics at its end; one it
        refused (429 busy, a draft vLLM will not load) is not, as an hf request refused before its turns."""
        outcome, m = "failed", self.metrics
        try:
            results, seconds = await self.vllm.run(runner, folder, k, prompts, max_tokens)
            steps = [a for r in results for a in r["accepted_per_step"]]
            m.speculative_steps.inc(len(steps))
            m.speculative_draft_tokens.inc(len(steps) * k)
            m.speculative_accepted_tokens.inc(sum(steps) - len(steps))
            m.speculative_output_tokens.inc(sum(len(r["output_ids"]) for r in results))
            m.speculative_prompts.inc(len(results))
            outcome = "done"
        except ServiceError:
            outcome = None
            raise
        finally:
            if outcome is not None:
                m.speculative_evaluations.labels(outcome).inc()
        return results, seconds

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
        context = context_length(runner)
        if context is not None and len(ids) + room > context:
            raise context_exceeded(context, len(ids), room, "max_tokens", "max_tokens and K")
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


def _advance(decodings: list[Decoding], forwards: int) -> tuple[int, int, int]:
    """On the model thread, in one turn: up to ``forwards`` target forwards (a prompt's prefill or a verify
    step), through the prompts in order, the next starting in the same turn where one ends. Each prompt's
    loop is the same as alone, so the tokens are too. The verify steps, accepted proposals and output tokens."""
    steps = accepted = emitted = 0
    for decoding in decodings:
        while forwards and not decoding.done:
            before = len(decoding.output)
            if decoding.output:
                decoding.step()
                steps, accepted = steps + 1, accepted + decoding.accepted[-1] - 1
            else:
                decoding.prefill()
            emitted, forwards = emitted + len(decoding.output) - before, forwards - 1
        if not forwards:
            break
    return steps, accepted, emitted


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
