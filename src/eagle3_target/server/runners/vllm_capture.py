"""vLLM capture, inside each vLLM worker: hooks record a forward's token ids, positions, layers and final states.

vLLM computes logits for the sampled position only and its hidden-states connector is CUDA-only, so
the runner hooks the model inside vLLM's workers instead (works on CPU and GPU alike): the asked
layers' outputs (vLLM defers the residual add, so a layer's output is hidden + residual) and the
model's final, normed hidden states, which go through the model's own lm_head (compute_logits).

Every rank hooks what it holds. Under tensor parallel each layer's output and the final states are
whole on every rank (the all-reduce is inside the layer), so the first rank of each tensor-parallel
group answers; under pipeline parallel each layer comes from the stage that holds it, and the final
states and logits from the last stage. ``merge`` puts the ranks' parts together on the driver.
The functions taking a ``worker`` run in every worker through ``collective_rpc``.
"""

from __future__ import annotations

import torch
from torch import nn

from eagle3_target.protocol.features import WEIGHT_LM_HEAD

from .hf import decoder_layers

CAPTURE = "_eagle3_capture"  # the attribute holding a worker's Recorder
FINAL, LOGITS = "final", "logits"


def _ranks() -> tuple[int, int, bool, bool]:
    """This worker's tensor-parallel rank and size, and whether it is the first and last pipeline stage."""
    from vllm.distributed import get_pp_group, get_tp_group

    tp, pp = get_tp_group(), get_pp_group()
    return tp.rank_in_group, tp.world_size, pp.is_first_rank, pp.is_last_rank


def _held(module) -> bool:
    """vLLM puts a PPMissingLayer where another pipeline stage holds the module."""
    return module is not None and type(module).__name__ != "PPMissingLayer"


class Recorder:
    """Lives in a vLLM worker: records each forward's token ids, positions, held layers and final states."""

    def __init__(self, model: nn.Module, layer_ids: list[int]):
        self.model = model
        self.steps: list[dict] = []
        self.layer_ids: list[int] | None = None
        self.layer_hooks: list = []
        self.hooks = [
            model.register_forward_pre_hook(self._begin, with_kwargs=True),
            model.register_forward_hook(self._end, with_kwargs=True),
        ]
        self.watch(layer_ids)

    def _modules(self) -> dict[int, nn.Module]:
        """The layers this rank holds by id (-1: the embedding module, on the first stage)."""
        layers = decoder_layers(self.model)
        inner = getattr(self.model, "model", None)
        start, end = getattr(inner, "start_layer", 0), getattr(inner, "end_layer", len(layers))
        held = {i: layers[i] for i in range(start, end) if _held(layers[i])}
        # -1: Llama-style models' embed_tokens (vLLM's get_input_embeddings may want input_ids)
        embed = getattr(inner, "embed_tokens", None)
        if embed is None and hasattr(self.model, "get_input_embeddings"):
            embed = self.model.get_input_embeddings()
        if _held(embed) and _ranks()[2]:
            held[-1] = embed
        return held

    def watch(self, layer_ids: list[int]) -> None:
        """Hook those of these layers this rank holds, from the next forward on."""
        if list(layer_ids) == self.layer_ids:
            return
        for hook in self.layer_hooks:
            hook.remove()
        held = self._modules()
        self.layer_hooks = [held[i].register_forward_hook(self._layer(i)) for i in layer_ids if i in held]
        self.layer_ids = list(layer_ids)

    def _begin(self, _module, _args, kwargs):
        self.steps.append({"input_ids": kwargs.get("input_ids"), "positions": kwargs["positions"]})

    def _layer(self, layer_id: int):
        def hook(_module, _args, output):
            # vLLM layers return (hidden, residual) with the residual add left to the next layer.
            if isinstance(output, tuple):
                hidden, residual = output[0], output[1]
                output = hidden if residual is None else hidden + residual
            self.steps[-1][layer_id] = output

        return hook

    def _end(self, _module, _args, _kwargs, output):
        output = output[0] if isinstance(output, tuple) else output
        if isinstance(output, torch.Tensor):  # the last stage; the others hand on IntermediateTensors
            self.steps[-1][FINAL] = output

    def take(self, input_ids: torch.Tensor, positions: torch.Tensor, logits: bool = True) -> dict:
        """This rank's part of the batch's step, by layer id, FINAL and LOGITS (asked and held only), of the
        tokens sent, checked to be exactly those, in order; the recorded steps are dropped."""
        steps, self.steps = self.steps, []
        count = len(input_ids)
        # The batch's step: its first T tokens are the rows sent, back to back (a step may be padded).
        step = next((s for s in steps if self._carries(s, input_ids, positions)), None)
        if step is None:
            raise RuntimeError(
                "vLLM did not prefill the batch in one step, in the order sent; send smaller batches"
            )
        part = {i: step[i][:count] for i in self.layer_ids if i in step}
        if FINAL in step:
            part[FINAL] = step[FINAL][:count]
            if logits:  # collective under tensor parallel: every rank of the last stage computes
                # The model's own head: the lm_head (logit scaling, vocab unpadding) vLLM samples with.
                part[LOGITS] = self.model.compute_logits(part[FINAL])
        return part

    @staticmethod
    def _carries(step: dict, input_ids: torch.Tensor, positions: torch.Tensor) -> bool:
        count = len(input_ids)
        got_ids, got_pos = step["input_ids"], step["positions"]
        if len(got_pos) < count or not torch.equal(got_pos[:count], positions.to(got_pos.device)):
            return False
        return got_ids is None or torch.equal(got_ids[:count], input_ids.to(got_ids.device))


def _answer(value, world: int):
    """Across processes an answer is pickled: hand back host memory, never a device handle."""
    if world == 1 or value is None:
        return value
    if isinstance(value, dict):
        return {k: None if v is None else v.cpu() for k, v in value.items()}
    return value.cpu()


def merge(parts: list[dict | None], layer_ids: list[int]) -> dict:
    """The ranks' parts as one: every asked layer, FINAL and LOGITS from the rank that holds it."""
    whole = {}
    for part in parts:
        whole.update(part or {})
    missing = [i for i in layer_ids if i not in whole]
    if missing:
        raise RuntimeError(f"no vLLM rank captured layers {missing}")
    return whole


# The functions below run inside each vLLM worker (collective_rpc): the first argument is the worker.
def install_capture(worker, aux_layer_ids: list[int]) -> None:
    setattr(worker, CAPTURE, Recorder(worker.model_runner.model, aux_layer_ids))


def watch_layers(worker, layer_ids: list[int]) -> None:
    getattr(worker, CAPTURE).watch(layer_ids)


def forget_steps(worker) -> None:
    """Drop what the forwards since the last capture recorded (a generation's: nothing takes them)."""
    getattr(worker, CAPTURE).steps = []


def take_capture(worker, input_ids: torch.Tensor, positions: torch.Tensor, logits: bool = True):
    part = getattr(worker, CAPTURE).take(input_ids, positions, logits)
    tp_rank, world = _ranks()[0], worker.vllm_config.parallel_config.world_size
    # The tensor-parallel group's other ranks hold the same states: its first rank answers.
    return None if tp_rank else _answer(part, world)


def plain_head(worker) -> bool | None:
    """Whether logits are exactly lm_head(final hidden): a bias-free head, no scaling (None: no head here).
    Under tensor parallel each logit is still one row of the head times the final state."""
    model = worker.model_runner.model
    head, processor = getattr(model, "lm_head", None), getattr(model, "logits_processor", None)
    if not _ranks()[3]:
        return None
    return (
        isinstance(getattr(head, "weight", None), torch.Tensor)
        and getattr(head, "bias", None) is None
        and getattr(processor, "scale", None) == 1.0
        and getattr(processor, "soft_cap", 0.0) is None
    )


def _real_rows(module) -> torch.Tensor:
    """A vocabulary-parallel weight's rows of the real vocabulary on this rank (no padding)."""
    weight = module.weight.detach()
    shard = getattr(module, "shard_indices", None)
    return weight if shard is None else weight[: shard.org_vocab_end_index - shard.org_vocab_start_index]


def head_shard(worker, name: str):
    """The last stage's lm_head rows (this rank's shard) or final norm (first rank only); None elsewhere."""
    model = worker.model_runner.model
    tp_rank, _, _, last = _ranks()
    world = worker.vllm_config.parallel_config.world_size
    if not last:
        return None
    if name == WEIGHT_LM_HEAD:
        return _answer(_real_rows(model.lm_head), world)
    return None if tp_rank else _answer(model.model.norm.weight.detach(), world)


def head_rows(worker, ids: torch.Tensor):
    """The lm_head rows of ``ids`` this rank holds, with the mask of which they are; None off the last stage."""
    if not _ranks()[3]:
        return None
    head = worker.model_runner.model.lm_head
    shard = getattr(head, "shard_indices", None)
    start, end = (
        (0, len(head.weight)) if shard is None else (shard.org_vocab_start_index, shard.org_vocab_end_index)
    )
    ids = ids.to(head.weight.device)
    mine = (ids >= start) & (ids < end)
    rows = head.weight.detach().index_select(0, ids[mine] - start)
    return _answer({"mask": mine, "rows": rows}, worker.vllm_config.parallel_config.world_size)


def embedding_shard(worker):
    """The first stage's embedding rows (this rank's shard of the real vocabulary); None elsewhere."""
    if not _ranks()[2]:
        return None
    model = worker.model_runner.model
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if embed is None:
        embed = model.get_input_embeddings()
    return _answer(_real_rows(embed), worker.vllm_config.parallel_config.world_size)


def drop_capture(worker) -> None:
    capture = getattr(worker, CAPTURE, None)
    for hook in [*capture.hooks, *capture.layer_hooks] if capture else []:
        hook.remove()


def row_positions(lengths: list[int]) -> torch.Tensor:
    return torch.cat([torch.arange(n) for n in lengths])
