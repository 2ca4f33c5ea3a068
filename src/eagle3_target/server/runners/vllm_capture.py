"""vLLM capture, inside each vLLM worker: hooks record a forward's token ids, positions, layers and final states.

vLLM computes logits for the sampled position only and its hidden-states connector is CUDA-only, so
the runner hooks the model inside vLLM's worker instead (works on CPU and GPU alike): the asked
layers' outputs (vLLM defers the residual add, so a layer's output is hidden + residual) and the
model's final, normed hidden states, which go through the model's own lm_head (compute_logits).
The functions taking a ``worker`` run in every worker through ``collective_rpc``.
"""

from __future__ import annotations

import torch
from torch import nn

from eagle3_target.protocol.features import WEIGHT_LM_HEAD

from .hf import decoder_layers

CAPTURE = "_eagle3_capture"  # the attribute holding a worker's Recorder


class Recorder:
    """Lives in a vLLM worker: records each forward's token ids, positions, asked layers and final states."""

    def __init__(self, model: nn.Module, layer_ids: list[int]):
        self.model = model
        self.steps: list[dict] = []
        self.layer_ids: list[int] = []
        self.layer_hooks: list = []
        self.hooks = [
            model.register_forward_pre_hook(self._begin, with_kwargs=True),
            model.register_forward_hook(self._end, with_kwargs=True),
        ]
        self.watch(layer_ids)

    def watch(self, layer_ids: list[int]) -> None:
        """Hook these layers (-1: the embedding output) from the next forward on."""
        if list(layer_ids) == self.layer_ids:
            return
        for hook in self.layer_hooks:
            hook.remove()
        layers = decoder_layers(self.model)
        # -1: Llama-style models' embed_tokens (vLLM's get_input_embeddings may want input_ids)
        embed = getattr(getattr(self.model, "model", None), "embed_tokens", None)
        if embed is None and -1 in layer_ids:
            embed = self.model.get_input_embeddings()
        modules = [(i, layers[i] if i >= 0 else embed) for i in layer_ids]
        self.layer_hooks = [module.register_forward_hook(self._layer(i)) for i, module in modules]
        self.layer_ids = list(layer_ids)

    def _begin(self, _module, _args, kwargs):
        self.steps.append({"input_ids": kwargs["input_ids"], "positions": kwargs["positions"]})

    def _layer(self, layer_id: int):
        def hook(_module, _args, output):
            # vLLM layers return (hidden, residual) with the residual add left to the next layer.
            if isinstance(output, tuple):
                hidden, residual = output[0], output[1]
                output = hidden if residual is None else hidden + residual
            self.steps[-1][layer_id] = output

        return hook

    def _end(self, _module, _args, _kwargs, output):
        self.steps[-1]["final"] = output[0] if isinstance(output, tuple) else output

    def take(self, input_ids: torch.Tensor, positions: torch.Tensor, logits: bool = True):
        """Logits [T, V] (None unless asked), the watched layers [T, n*H] (None if none) and final states
        [T, H] of the tokens sent, checked to be exactly those, in order; the recorded steps are dropped."""
        steps, self.steps = self.steps, []
        count = len(input_ids)
        # The batch's step: its first T tokens are the rows sent, back to back (a step may be padded).
        step = next((s for s in steps if self._carries(s, input_ids, positions)), None)
        if step is None:
            raise RuntimeError(
                "vLLM did not prefill the batch in one step, in the order sent; send smaller batches"
            )
        layers = torch.cat([step[i][:count] for i in self.layer_ids], dim=-1) if self.layer_ids else None
        hidden = step["final"][:count]
        # The model's own head: the lm_head (logit scaling, vocab unpadding) vLLM samples with.
        return (self.model.compute_logits(hidden) if logits else None), layers, hidden

    @staticmethod
    def _carries(step: dict, input_ids: torch.Tensor, positions: torch.Tensor) -> bool:
        count = len(input_ids)
        got_ids, got_pos = step["input_ids"], step["positions"]
        return (
            len(got_ids) >= count
            and torch.equal(got_ids[:count], input_ids.to(got_ids.device))
            and torch.equal(got_pos[:count], positions.to(got_pos.device))
        )


def _rank_and_world() -> tuple[int, int]:
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()


# The functions below run inside each vLLM worker (collective_rpc): the first argument is the worker.
def install_capture(worker, aux_layer_ids: list[int]) -> None:
    setattr(worker, CAPTURE, Recorder(worker.model_runner.model, aux_layer_ids))


def watch_layers(worker, layer_ids: list[int]) -> None:
    getattr(worker, CAPTURE).watch(layer_ids)


def take_capture(worker, input_ids: torch.Tensor, positions: torch.Tensor, logits: bool = True):
    outputs = getattr(worker, CAPTURE).take(input_ids, positions, logits)
    rank, world = _rank_and_world()
    if rank:
        return None  # every rank computes (the lm_head gather is collective); rank 0 answers
    # Across processes the answer is pickled: hand back host memory, never a device handle.
    return tuple(None if t is None else t.cpu() for t in outputs) if world > 1 else outputs


def plain_head(worker) -> bool:
    """Whether logits are exactly lm_head(final hidden): one unsharded, bias-free head, no scaling."""
    model = worker.model_runner.model
    head, processor = getattr(model, "lm_head", None), getattr(model, "logits_processor", None)
    return (
        _rank_and_world()[1] == 1
        and isinstance(getattr(head, "weight", None), torch.Tensor)
        and getattr(head, "bias", None) is None
        and getattr(processor, "scale", None) == 1.0
        and getattr(processor, "soft_cap", 0.0) is None
    )


def lm_head_rows(worker, ids: torch.Tensor) -> torch.Tensor:
    weight = worker.model_runner.model.lm_head.weight
    return weight.detach().index_select(0, ids.to(weight.device))


def whole_weight(worker, name: str) -> torch.Tensor:
    """The lm_head (padded rows included) or the final norm, on a single-rank worker."""
    model = worker.model_runner.model
    return (model.lm_head if name == WEIGHT_LM_HEAD else model.model.norm).weight.detach()


def embedding_shard(worker) -> torch.Tensor:
    model = worker.model_runner.model
    weight = model.get_input_embeddings().weight if hasattr(model, "get_input_embeddings") else None
    if weight is None:
        weight = model.model.embed_tokens.weight
    return weight.detach().cpu() if _rank_and_world()[1] > 1 else weight.detach()


def drop_capture(worker) -> None:
    capture = getattr(worker, CAPTURE, None)
    for hook in [*capture.hooks, *capture.layer_hooks] if capture else []:
        hook.remove()


def row_positions(lengths: list[int]) -> torch.Tensor:
    return torch.cat([torch.arange(n) for n in lengths])
