"""The hf engine split over ranks: transformers' tensor parallel plan (or pipeline stages,
hf_pipeline.py), rank 0 leading every call (leading.py).

Every rank loads the model with ``tp_plan="auto"`` (each holds its shard of the projections,
the embedding and the lm_head). What comes back is whole: decoder-layer outputs are all-reduced by
the plan, logits gathered (``colwise_gather_output``), and sharded weights gathered by leading.py.
"""

from __future__ import annotations

import itertools
import logging
import tempfile

import torch

from ..options import EMBEDDED_MODEL
from ..parallel import ParallelLayout
from ..ranks import RankGroup, join, rank_device
from .base import Captured, ForwardInputs, resolve_dtype
from .hf import HFRunner
from .hf_pipeline import load_stage
from .leading import LeadingRunner, follow_calls
from .rank_refresh import RankRefresh, wait_outcomes

log = logging.getLogger(__name__)


def node_options(options: dict) -> dict:
    """The load options of this node's ranks: the embedded tiny Llama is written to a directory first
    (before any rank joins: transformers saves only from rank 0 of a group), so every rank loads the
    same weights the same way. ``name`` keeps what /model_info reports."""
    options = {k: v for k, v in options.items() if k != "parallel"}  # JSON-safe, for the rank processes
    if options.get("model") is not None:
        return {**options, "name": options["model"]}
    from .tiny import build_tiny_llama

    path = tempfile.mkdtemp(prefix="eagle3-tiny-")
    build_tiny_llama().save_pretrained(path)
    return {**options, "model": path, "name": EMBEDDED_MODEL}


def split_runner(options: dict, rank: int, world_size: int, device: str):
    """This rank's runner: a pipeline stage (hf_pipeline.py) or a tensor-parallel shard."""
    stages = options.get("pipeline_parallel_size", 1)
    if stages > 1:
        dtype = resolve_dtype(options.get("dtype", "auto"), device)
        return load_stage(options, rank, stages, device, dtype)
    module, name = load_split_model(options, world_size, device)
    return HFRunner(module, name=name, aux_layer_ids=options.get("aux_layer_ids"))


def load_split_model(options: dict, world_size: int, device: str):
    """(model, name): this rank's shard of the model (``options`` from node_options)."""
    from transformers import AutoModelForCausalLM

    module = AutoModelForCausalLM.from_pretrained(
        options["model"],
        dtype=resolve_dtype(options.get("dtype", "auto"), device),
        trust_remote_code=options.get("trust_remote_code", False),
        **_tensor_parallel(world_size),
    )
    return module, options["name"]


def _tensor_parallel(size: int) -> dict:
    """from_pretrained's arguments for the model's own tensor-parallel plan over ``size`` ranks: a
    DistributedConfig where transformers has one (5.x), the older tp_plan/tp_size otherwise."""
    try:
        from transformers import DistributedConfig
    except ImportError:
        return {"tp_plan": "auto", "tp_size": size}
    return {"distributed_config": DistributedConfig(tp_size=size, tp_plan="auto")}


class HFParallelRunner(LeadingRunner):
    """Rank 0 of a split hf replica. A refresh (refresh.py) has two phases on every rank (rank_refresh.py):
    ``begin_staging`` and ``wait_staged``, then ``replace_weights`` or ``drop_staged``."""

    def __init__(self, inner, group: RankGroup, layout: ParallelLayout):
        super().__init__(inner, group, layout)
        self._tickets = itertools.count()

    def begin_staging(self, source: str) -> int:
        """On the model thread: every rank starts reading its part of ``source``; the refresh's ticket."""
        ticket = next(self._tickets)
        self._everywhere("stage_weights", source, ticket)
        return ticket

    def wait_staged(self, ticket: int) -> None:
        """Off the model thread: until every rank has its part; the first rank's refusal raised."""
        wait_outcomes(self.group, ticket)

    def replace_weights(self, ticket: int) -> None:
        """On the model thread, between forwards: every rank's staged part into what it serves."""
        self._everywhere("commit_weights", ticket, True)

    def drop_staged(self, ticket: int) -> None:
        if self.group.dead is None:  # a replica that lost a rank has nothing left to drop it on
            self._everywhere("commit_weights", ticket, False)

    def forward(self, input_ids, attention_mask, **packed):
        return self._everywhere("forward", input_ids, attention_mask, **packed)

    def forward_hidden(self, input_ids, attention_mask, **packed):
        return self._everywhere("forward_hidden", input_ids, attention_mask, **packed)

    def capture(self, inputs: ForwardInputs, want) -> Captured:
        return self._everywhere("capture", inputs, want)

    def lm_head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self._everywhere("weight", "lm_head").index_select(0, ids.to(self._device))

    def input_embeddings(self) -> torch.Tensor:
        return self._everywhere("input_embeddings")

    def weight(self, name: str) -> torch.Tensor:
        return self._everywhere("weight", name)


def rank_options(options: dict, layout: ParallelLayout) -> dict:
    """What every rank of the replica loads with (the rank processes get it as JSON)."""
    return {**node_options(options), "engine": "hf", "pipeline_parallel_size": layout.pipeline_parallel_size}


def load(*, parallel: ParallelLayout, **options) -> HFParallelRunner:
    """Rank 0: start the node's ranks, load this rank's shard, and lead."""
    device = options.get("device", "cpu")
    options = rank_options(options, parallel)
    group = join(parallel, options, device)
    inner = RankRefresh(split_runner(options, 0, parallel.world_size, rank_device(device, 0)), group)
    log.info("rank 0 of %d leads the hf replica (%s)", parallel.world_size, parallel.describe())
    return HFParallelRunner(inner, group, parallel)


def follow(*, parallel: ParallelLayout, **options) -> None:
    """A node-rank > 0 `serve`: start the node's other ranks, then follow rank 0 until the replica ends."""
    options = rank_options(options, parallel)
    follow_group(join(parallel, options, options.get("device", "cpu")), options)


def follow_group(group: RankGroup, options: dict) -> None:
    """Load this rank's shard and run every call rank 0 broadcasts, until it says stop."""
    device = rank_device(options.get("device", "cpu"), group.spec.local_rank)
    runner = split_runner(options, group.rank, group.spec.world_size, device)
    follow_calls(group, RankRefresh(runner, group), device)
