"""The hf engine's decoding loop: transformers' model with its KV cache, advanced a bounded number of tokens
at a time so the server can give the model to other requests between chunks (generation.py).

Each step is what transformers' ``generate`` does for one sequence: the forward of the new token over the
cache, then argmax (temperature 0) or temperature, top-k, top-p (transformers' own warpers, in generate's
order) and a draw from a generator seeded per request. So greedy output equals ``generate(do_sample=False)``
token for token, and the same seed gives the same tokens.
"""

from __future__ import annotations

import inspect
import secrets

import torch
from torch import nn
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ..sampling import FINISH_LENGTH, FINISH_STOP, SamplingParams


def eos_token_ids(model: nn.Module) -> frozenset[int]:
    """The ids that end a sequence: the generation config's, else the model config's (as generate reads them)."""
    config = getattr(model, "generation_config", None)
    ids = getattr(config, "eos_token_id", None)
    if ids is None:
        ids = getattr(model.config.get_text_config(), "eos_token_id", None)
    if ids is None:
        return frozenset()
    return frozenset([ids] if isinstance(ids, int) else ids)


def cache_argument(model: nn.Module) -> str:
    """What the model's forward calls its KV cache: ``cache`` from transformers 5.2x on, ``past_key_values``
    before (the transformers vLLM's environment pins), its output's field named alike."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _warpers(params: SamplingParams) -> LogitsProcessorList:
    warpers = LogitsProcessorList()
    if params.greedy:
        return warpers  # argmax: nothing to warp
    if params.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k > 0:
        warpers.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(params.top_p))
    return warpers


class HFDecoding:
    """One sequence being generated: its tokens so far, its KV cache and its random generator."""

    def __init__(self, model: nn.Module, prompt_ids: list[int], params: SamplingParams, eos: frozenset[int]):
        device = next(model.parameters()).device
        self.model, self.params, self.eos = model, params, eos
        self.ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
        self.generated: list[int] = []
        self.finish: str | None = None
        self._cache = None
        self._warpers = _warpers(params)
        self._cache_name = cache_argument(model)
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        self._generator = torch.Generator(device=device).manual_seed(seed)

    @torch.inference_mode()
    def advance(self, steps: int) -> list[int]:
        """Up to ``steps`` more tokens (the first call also runs the prompt); fewer at the end of the sequence."""
        new: list[int] = []
        while self.finish is None and len(new) < steps:
            step_input = self.ids[:, -1:] if self.generated or new else self.ids  # the prompt first
            token = self._choose(self._logits(step_input))
            self.ids = torch.cat([self.ids, token[:, None]], dim=-1)
            new.append(int(token))
            if new[-1] in self.eos:
                self.finish = FINISH_STOP
            elif len(self.generated) + len(new) >= self.params.max_tokens:
                self.finish = FINISH_LENGTH
        self.generated += new
        if self.finish is not None:
            self._cache = None  # the KV cache's memory goes back as soon as the sequence ends
        return new

    def _logits(self, step_input: torch.Tensor) -> torch.Tensor:
        """The next token's logits [1, V] after ``step_input``, the cache advanced over it."""
        # logits_to_keep=1: only the last position's logits, as generate computes them
        cache = {self._cache_name: self._cache}
        out = self.model(input_ids=step_input, **cache, use_cache=True, logits_to_keep=1)
        self._cache = getattr(out, self._cache_name)
        return out.logits[:, -1, :].float()

    def _choose(self, logits: torch.Tensor) -> torch.Tensor:
        if self.params.greedy:
            return logits.argmax(dim=-1)
        scores = self._warpers(self.ids, logits)
        probs = nn.functional.softmax(scores, dim=-1)
        return torch.multinomial(probs, num_samples=1, generator=self._generator).squeeze(1)
