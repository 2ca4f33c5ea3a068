"""The hf engine split over ranks: transformers' tensor parallel plan (or pipeline stages,
hf_pipeline.py), rank 0 leading every call.

Every rank loads the model with ``tp_plan="auto"`` (each holds its shard of the projections,
the embedding and the lm_head). Rank 0 is the runner the server sees: before each call it
broadcasts the call's name and arguments, and every rank runs it, so the collectives inside the
forward line up. What comes back is whole: decoder-layer outputs are all-reduced by the plan,
logits gathered (``colwise_gather_output``), and sharded weights are gathered here.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ..options import EMBEDDED_MODEL
from ..parallel import ParallelLayout
from ..ranks import RankGroup, join, rank_device
from .base import Captured, ForwardInputs, RunnerInfo, resolve_dtype

log = logging.getLogger(__name__)
STOP = None  # the command that ends the followers' loop


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
    from .hf import HFRunner

    stages = options.get("pipeline_parallel_size", 1)
    if stages > 1:
        from .hf_pipeline import load_stage

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


def _whole(value):
    """A DTensor gathered to one plain tensor (a collective: every rank calls it); anything else as is."""
    if isinstance(value, DTensor):
        return value.full_tensor()
    if isinstance(value, Captured):
        return Captured(*(_whole(getattr(value, f.name)) for f in dataclasses.fields(Captured)))
    if isinstance(value, tuple):
        return tuple(_whole(v) for v in value)
    return value


def moved(value, device):
    """Call arguments on ``device``: rank 0 sends them from the CPU, each rank takes them to its own."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, ForwardInputs):
        return ForwardInputs(*(moved(getattr(value, f.name), device) for f in dataclasses.fields(value)))
    if isinstance(value, tuple):
        return tuple(moved(v, device) for v in value)
    if isinstance(value, dict):
        return {k: moved(v, device) for k, v in value.items()}
    return value


def run_call(runner, call, device):
    """One broadcast call (name, args, kwargs) on this rank's runner, its result whole."""
    name, args, kwargs = call
    return _whole(getattr(runner, name)(*moved(args, device), **moved(kwargs, device)))


class LeadingRunner:
    """Rank 0 of a split replica (hf or sglang): the server's runner. Each call is run by every rank; tensors
    travel on the CPU and each rank takes them to its own device."""

    def __init__(self, inner, group: RankGroup, layout: ParallelLayout):
        self.inner, self.group = inner, group
        self.info: RunnerInfo = dataclasses.replace(inner.info, parallel=layout.describe())
        self._device = inner.info.device

    def _everywhere(self, name: str, *args, **kwargs):
        dist.broadcast_object_list([(name, moved(args, "cpu"), moved(kwargs, "cpu"))], src=0)
        return run_call(self.inner, (name, args, kwargs), self._device)

    def healthy(self) -> bool:
        """False once any rank of the replica is gone (ranks.py's watchdog)."""
        return self.group.dead is None

    def close(self) -> None:
        if dist.is_initialized() and self.group.dead is None:
            dist.broadcast_object_list([STOP], src=0)
        self.group.stop_children()
        self.inner.close()


class HFParallelRunner(LeadingRunner):
    """Rank 0 of a split hf replica."""

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


def load(options: dict, layout: ParallelLayout) -> HFParallelRunner:
    """Rank 0: start the node's ranks, load this rank's shard, and lead."""
    device = options.get("device", "cpu")
    options = {**node_options(options), "pipeline_parallel_size": layout.pipeline_parallel_size}
    group = join(layout, options, device)
    inner = split_runner(options, 0, layout.world_size, rank_device(device, 0))
    log.info("rank 0 of %d leads the hf replica (%s)", layout.world_size, layout.describe())
    return HFParallelRunner(inner, group, layout)


def follow(options: dict, layout: ParallelLayout) -> None:
    """A node-rank > 0 `serve`: start the node's other ranks, then follow rank 0 until the replica ends."""
    options = {**node_options(options), "pipeline_parallel_size": layout.pipeline_parallel_size}
    follow_group(join(layout, options, options.get("device", "cpu")), options)


def follow_group(group: RankGroup, options: dict) -> None:
    """Load this rank's shard and run every call rank 0 broadcasts, until it says stop."""
    device = rank_device(options.get("device", "cpu"), group.spec.local_rank)
    follow_calls(group, split_runner(options, group.rank, group.spec.world_size, device), device)


def follow_calls(group: RankGroup, runner, device: str) -> None:
    """Run every call rank 0 broadcasts on this rank's ``runner``, until it says stop."""
    try:
        while True:
            box = [None]
            dist.broadcast_object_list(box, src=0)
            if box[0] is STOP:
                return
            try:
                run_call(runner, box[0], device)
            except Exception:  # noqa: BLE001 - rank 0 met the same error and answers the client
                log.debug("rank %d: call %s failed as on rank 0", group.rank, box[0][0], exc_info=True)
    finally:
        group.stop_children()
