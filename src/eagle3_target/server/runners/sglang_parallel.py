"""The sglang engine split over GPUs (tensor parallel): one SGLang ModelRunner per rank, rank 0 leading.

SGLang's own scheduler runs one process per tensor-parallel rank and hands every batch to each; here the
ranks are ranks.py's processes (rank r on cuda:r), joined in one NCCL group that SGLang's ModelRunner takes
over, and rank 0 broadcasts each call so every rank runs the same extend forward and the collectives inside
it line up. Logits come back gathered by SGLang's LogitsProcessor, aux states whole after each layer's
all-reduce, and the embedding rows are gathered by ``SGLangRunner.input_embeddings``. One node, GPUs only:
preflight refuses pipeline parallel, several nodes and a CPU.
"""

from __future__ import annotations

import logging

import torch

from ..parallel import ParallelLayout
from ..ranks import RankGroup, join, rank_device
from .base import Captured, ForwardInputs
from .leading import LeadingRunner, follow_calls
from .sglang import SGLangRunner, checked_options

log = logging.getLogger(__name__)


def rank_options(options: dict, group: RankGroup) -> dict:
    """SGLangRunner.build's arguments for this rank of ``group``."""
    spec = group.spec
    device = rank_device(options.get("device", "cuda"), spec.local_rank)
    load = {k: v for k, v in options.items() if k not in ("engine", "parallel")}
    return {**load, "device": device, "tp_rank": spec.rank, "tp_size": spec.world_size}


class SGLangParallelRunner(LeadingRunner):
    """Rank 0 of a split sglang replica."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        return self._everywhere("forward", input_ids, attention_mask)

    def capture(self, inputs: ForwardInputs, want) -> Captured:
        return self._everywhere("capture", inputs, want)

    def weight(self, name: str) -> torch.Tensor:
        return self._everywhere("weight", name)

    def input_embeddings(self) -> torch.Tensor:
        return self._everywhere("input_embeddings")


def load(*, parallel: ParallelLayout, **options) -> SGLangParallelRunner:
    """Rank 0: start this node's other ranks, build this rank's ModelRunner, and lead."""
    options = checked_options(options)
    options["engine"] = "sglang"  # what the rank processes follow with (rank_process.py)
    group = join(parallel, options, "cuda")
    inner = SGLangRunner.build(**rank_options(options, group))
    log.info("rank 0 of %d leads the sglang replica (tensor parallel)", parallel.world_size)
    return SGLangParallelRunner(inner, group, parallel)


def follow_group(group: RankGroup, options: dict) -> None:
    """A rank other than 0: build this rank's ModelRunner and run every call rank 0 broadcasts."""
    load = rank_options(options, group)
    follow_calls(group, SGLangRunner.build(**load), load["device"])
