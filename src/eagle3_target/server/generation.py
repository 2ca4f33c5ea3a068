"""Text generation for the OpenAI-compatible endpoints, from the runner that serves supervision (no second
load, no HTTP): the prompt built and tokenized as vLLM does it, the engine's decoding advanced a chunk per
turn at the model through the same fair scheduler /generate uses, text decoded skipping special tokens,
stop strings cut, tokens counted.

A generation waits for its turn like a /generate does, at a lower class by default (--generation-priority),
decodes --generation-chunk-tokens tokens and queues again; each turn is charged the model time of the one
before (the first, of a mean chunk: FairScheduler.tokens_for), so a supervision request never waits behind more than one
chunk and a flood of generations gets the model time its class weighs, not more.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from .errors import InvalidInput
from .generation_options import GenerationOptions
from .metrics import ServerMetrics
from .model_host import ModelHost
from .openai_request import GenerationAsk
from .runners.base import Decoding, GeneratingRunner
from .sampling import FINISH_STOP, SamplingParams
from .scheduler import FairScheduler, priority_class

_EWMA = 0.2  # weight of the newest chunk in the mean chunk time
TENANT_PREFIX = "generation:"  # a client's generations take turns as one scheduler session of their own


@dataclass
class Piece:
    """New text of a generation; the last piece carries its finish reason."""

    text: str
    finish: str | None = None


@dataclass
class Generation:
    """A started generation: its prompt's size, and (once finished) the tokens it generated."""

    prompt_tokens: int
    pieces: AsyncIterator[Piece]
    completion_tokens: int = 0


class GenerationService:
    def __init__(
        self,
        model: ModelHost,
        turns: FairScheduler,
        options: GenerationOptions,
        max_prompt_tokens: int,
        max_priority: str,
        metrics: ServerMetrics,
    ):
        self.model, self.turns, self.options, self.metrics = model, turns, options, metrics
        self.max_prompt_tokens, self.max_priority = max_prompt_tokens, max_priority
        self._chunk_seconds = 0.0  # a moving mean of one chunk's model time: a new generation's first charge

    def runner(self) -> GeneratingRunner:
        """The ready runner, if it generates; NotReady while loading, InvalidInput where it cannot."""
        runner = self.model.ready()
        if not isinstance(runner, GeneratingRunner):
            raise InvalidInput(
                "generation_not_offered", f"the {runner.info.engine} engine does not generate text"
            )
        if runner.tokenizer is None:
            raise InvalidInput(
                "no_tokenizer", f"{runner.info.model} came without a tokenizer: it cannot generate text"
            )
        return runner

    async def start(self, ask: GenerationAsk, session: str, priority: str | None) -> Generation:
        """Check and tokenize the prompt (errors come here, before any reply is written); nothing runs yet."""
        runner = self.runner()
        priority = priority_class(priority or self.options.priority, self.max_priority)
        ids = await asyncio.to_thread(_prompt_ids, runner, ask)
        if len(ids) > self.max_prompt_tokens:
            raise InvalidInput(
                "prompt_too_long",
                f"the prompt has {len(ids)} tokens; this server takes {self.max_prompt_tokens}",
            )
        if max(ids) >= runner.info.vocab_size:
            raise InvalidInput(
                "token_out_of_range",
                f"prompt token {max(ids)} is past the vocabulary of {runner.info.vocab_size}",
            )
        params = _within_context(ask, len(ids), context_length(runner))
        self.metrics.prompt_tokens.inc(len(ids))
        generation = Generation(len(ids), None)
        decoding = runner.start_generation(ids, params)
        generation.pieces = self._run(runner, decoding, ask, TENANT_PREFIX + session, priority, generation)
        return generation

    async def _run(
        self, runner, decoding: Decoding, ask: GenerationAsk, tenant: str, priority: str, generation
    ):
        started, emitted, finish = time.perf_counter(), 0, "abort"
        fallback = generation.prompt_tokens + self.options.chunk_tokens  # before any time was measured
        charge = self.turns.tokens_for(self._chunk_seconds, fallback) if self._chunk_seconds else fallback
        stops = ask.params.stop
        try:
            while True:
                async with self.turns.turn(tenant, charge, priority, by_tokens=False):
                    start = time.perf_counter()
                    new, text = await self.model.call(_advance, decoding, self.options.chunk_tokens, runner)
                    held = time.perf_counter() - start
                self._chunk_seconds += _EWMA * (held - self._chunk_seconds) if self._chunk_seconds else held
                charge = self.turns.tokens_for(held, fallback=len(new) or 1)
                if new and not generation.completion_tokens:
                    self.metrics.time_to_first_token.observe(time.perf_counter() - started)
                generation.completion_tokens += len(new)
                self.metrics.generated_tokens.inc(len(new))
                cut = _first_stop(text, stops, emitted)
                if cut is not None or decoding.finish is not None:
                    finish = FINISH_STOP if cut is not None else decoding.finish
                    yield Piece(text[emitted:cut], finish)
                    return
                safe = _settled(text, stops)
                if safe > emitted:
                    yield Piece(text[emitted:safe])
                    emitted = safe
        finally:
            self.metrics.generations.labels(finish).inc()


def context_length(runner) -> int | None:
    """The most tokens, prompt and output together, the served model takes (its max_position_embeddings, a
    vllm engine's max model length); None where it does not say."""
    return getattr(runner, "max_model_len", None)


def context_exceeded(
    context: int, prompt_tokens: int, max_tokens: int, param: str, what: str = "the completion"
) -> InvalidInput:
    """The 400 of a request past the model's context, naming the numbers as vLLM's message does."""
    return InvalidInput(
        "context_length_exceeded",
        f"This model's maximum context length is {context} tokens. However, you requested "
        f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} in {what}). "
        "Please reduce the length of the prompt or completion.",
        param,
    )


def _within_context(ask: GenerationAsk, prompt_tokens: int, context: int | None) -> SamplingParams:
    """The sampling parameters, checked against the context: a max_tokens asked for that does not fit is
    refused; the default one is cut to the room left (as vLLM does), and a prompt that leaves none refused."""
    if context is None:
        return ask.params
    room, wanted = context - prompt_tokens, ask.params.max_tokens
    if room < 1 or (ask.max_tokens_given and wanted > room):
        param = "max_tokens" if ask.max_tokens_given else ("messages" if ask.chat else "prompt")
        raise context_exceeded(context, prompt_tokens, wanted if ask.max_tokens_given else 1, param)
    return dataclasses.replace(ask.params, max_tokens=min(wanted, room))


def _advance(decoding: Decoding, steps: int, runner: GeneratingRunner) -> tuple[list[int], str]:
    """On the model thread, in the turn: the next chunk and the text so far (its decoding counts as the turn's
    model time, not the event loop's)."""
    new = decoding.advance(steps)
    return new, runner.tokenizer.decode(decoding.generated, skip_special_tokens=True)


def _prompt_ids(runner: GeneratingRunner, ask: GenerationAsk) -> list[int]:
    """As vLLM: a chat through the tokenizer's template with the generation prompt, then encoded without
    special tokens (the template writes its own); a text prompt encoded with them; token ids as given."""
    tokenizer = runner.tokenizer
    if ask.chat:
        if not getattr(tokenizer, "chat_template", None):
            raise InvalidInput("no_chat_template", f"{runner.info.model}'s tokenizer has no chat template")
        try:
            text = tokenizer.apply_chat_template(
                ask.messages, add_generation_prompt=True, tokenize=False, **ask.template_kwargs
            )
        except (
            Exception
        ) as exc:  # a template's own error (raise_exception, a missing role): the caller's input
            raise InvalidInput("invalid_messages", f"the chat template refused the messages: {exc}") from None
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    elif isinstance(ask.prompt, str):
        ids = tokenizer(ask.prompt)["input_ids"]
    else:
        ids = list(ask.prompt)
    if not ids:
        raise InvalidInput("empty_prompt", "the prompt encodes to no tokens")
    return ids


def _first_stop(text: str, stops: tuple[str, ...], emitted: int) -> int | None:
    """Where the earliest stop string begins, searched past what was sent (less a stop's length), or None."""
    found = [i for stop in stops if (i := text.find(stop, max(0, emitted - len(stop) + 1))) >= 0]
    return min(found, default=None)


def _settled(text: str, stops: tuple[str, ...]) -> int:
    """How much of ``text`` can be sent: not a tail that may become a stop string, nor a half-decoded character."""
    end = len(text) - max((len(s) - 1 for s in stops), default=0)
    while end > 0 and text[end - 1] == "\ufffd":
        end -= 1
    return max(end, 0)
