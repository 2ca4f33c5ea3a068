"""Generation on a split hf replica (tensor parallel or pipeline stages): every rank runs each decode step
of a sequence, and the rank that holds the whole logits picks the token and broadcasts it.

Rank 0 leads (leading.py): the server's decoding on rank 0 is a ``LeadingDecoding``, whose ``advance``
broadcasts one ``generation_step`` call per chunk; every rank keeps its own part of the sequence by key (its
shard of the KV cache, or its stage's layers' cache) in a ``SplitDecoding``. A step is what the one-device
loop does (hf_generate.py): the forward over the cache, then the chooser rank warps and draws with the
request's seeded generator (rank 0 under tensor parallel, whose gathered logits every rank has; the last stage
under pipeline parallel, the only one with logits) and broadcasts the token, so every rank appends the same
one and all stop together. Pipeline stages compute what one device computes, so their tokens equal a
one-device replica's, sampled ones too; tensor parallel's all-reduce reorders additions (parallel.md).

A sequence ends on every rank when it finishes; one the server abandons (its client left) is dropped on every
rank with the next step of any sequence.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref

import torch
import torch.distributed as dist
from transformers import DynamicCache

from ..sampling import SamplingParams
from .hf import HFRunner
from .hf_generate import HFDecoding
from .hooks import Stop

_keys = itertools.count()


class StageCache(DynamicCache):
    """A pipeline stage's KV cache: only its own layers fill, so the lengths the model reads (positions, mask
    sizes) are asked of its first layer instead of layer 0, which another stage holds."""

    def __init__(self, layers: range, **kwargs):
        super().__init__(**kwargs)
        self.own = layers

    def _mine(self, layer_idx: int) -> int:
        return layer_idx if layer_idx in self.own else self.own[0]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return super().get_seq_length(self._mine(layer_idx))

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return super().get_query_offset(self._mine(layer_idx))

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        return super().get_mask_sizes(query_length, self._mine(layer_idx))


class SplitDecoding(HFDecoding):
    """This rank's part of one sequence: its cache (made up front: a stage that stops early returns none) and
    the forward, wrapped by ``around`` (a pipeline stage's send and receive hooks)."""

    def __init__(self, model, prompt_ids, params, eos, *, chooser: int, cache, around=contextlib.nullcontext):
        super().__init__(model, prompt_ids, params, eos)
        self.chooser, self._cache, self._around = chooser, cache, around

    def _logits(self, step_input: torch.Tensor) -> torch.Tensor | None:
        cache = {self._cache_name: self._cache}
        try:
            with self._around(step_input.shape):
                out = self.model(input_ids=step_input, **cache, use_cache=True, logits_to_keep=1)
        except Stop:  # a stage before the last: its output went on to the next stage
            return None
        return out.logits[:, -1, :].float()

    def _choose(self, logits: torch.Tensor | None) -> torch.Tensor:
        if dist.get_rank() == self.chooser:
            token = super()._choose(logits)
        else:
            token = torch.empty(1, dtype=torch.long, device=self.ids.device)
        dist.broadcast(token, src=self.chooser)
        return token


class SplitGenerating:
    """A rank's sequences of a split replica, by key; each ``generation_step`` rank 0 broadcasts advances one."""

    def split_decoding(self, prompt_ids: list[int], params: SamplingParams) -> SplitDecoding:
        """A tensor-parallel shard's part: its cache holds its heads; rank 0 has the gathered logits."""
        cache = DynamicCache(config=self.model.config)
        return SplitDecoding(self.model, prompt_ids, params, self._eos, chooser=0, cache=cache)

    def generation_step(self, key: int, steps: int, begin=None, drop=()) -> tuple[list[int], str | None]:
        """Up to ``steps`` tokens of sequence ``key`` (``begin``: its prompt and parameters, on its first step),
        after dropping the abandoned sequences ``drop``; the new tokens and the finish reason."""
        decodings = self.__dict__.setdefault("_decodings", {})
        for gone in drop:
            decodings.pop(gone, None)
        if begin is not None:
            decodings[key] = self.split_decoding(*begin)
        decoding = decodings[key]
        new = decoding.advance(steps)
        if decoding.finish is not None:
            del decodings[key]
        return new, decoding.finish


class ShardRunner(SplitGenerating, HFRunner):
    """One tensor-parallel rank of a split hf replica."""


class LeadingDecoding:
    """Rank 0's handle on a split replica's sequence: each advance is one generation_step on every rank."""

    def __init__(self, leader, prompt_ids: list[int], params: SamplingParams):
        self._leader, self._begin = leader, (list(prompt_ids), params)
        self.key = next(_keys)
        self.generated: list[int] = []
        self.finish: str | None = None
        # abandoned before its end: the ranks drop their part with the next step
        self._abandon = weakref.finalize(self, leader.abandoned.append, self.key)

    def advance(self, steps: int) -> list[int]:
        if self.finish is not None:
            return []
        begin, self._begin = self._begin, None
        new, self.finish = self._leader.generation_step(self.key, steps, begin)
        self.generated += new
        if self.finish is not None:
            self._abandon.detach()  # ended on every rank already
        return new
