"""The hf engine split into pipeline stages: rank r of P runs a contiguous slice of the decoder layers.

Every rank reads the checkpoint into CPU memory once, keeps its stage and frees the rest before it
moves to its device: the first stage keeps the input embedding, the last the final norm and lm_head,
and each stage its own layers (the others become ``_Skipped``, holding nothing). Each rank runs the
model's own forward, so everything the layers need besides the hidden state (positions, masks,
rotary embeddings) is computed on every rank from the same broadcast inputs; the hidden state enters
a stage at its first layer by point-to-point recv and leaves after its last by send. Captures are
sent to rank 0 from the rank that made them, so rank 0 answers exactly as one device does.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
import torch.distributed as dist
from torch import nn

from eagle3_target.protocol.features import WEIGHT_FINAL_NORM, WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD

from .base import Capture, Captured, ForwardInputs
from .hf import HFRunner, decoder_layers, final_norm
from .hf_vlm import embedding_output_point, load_pretrained, modalities
from .hf_weights import checkpoint_tensors
from .hooks import Stop, keep, keep_input
from .packing import block_causal_mask

log = logging.getLogger(__name__)
EMBEDDING = -1  # Capture's index of the embedding output, made on the first stage


def stage_layers(stage: int, stages: int, layers: int) -> range:
    """The decoder layers of ``stage``: an even split, the first stages one fewer where it is uneven."""
    return range(stage * layers // stages, (stage + 1) * layers // stages)


class _Skipped(nn.Module):
    """A layer another stage holds: the hidden state passes through (this stage never computes it)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        if hasattr(layer, "attention_type"):  # the decoder loop reads it to pick each layer's mask
            self.attention_type = layer.attention_type

    def forward(self, hidden_states, *_args, **_kwargs):
        return hidden_states


class _Zeros(nn.Module):
    """The input embedding of a later stage: only its shape is read (the first layer's input is replaced)."""

    def __init__(self, hidden: int, dtype: torch.dtype):
        super().__init__()
        self.hidden, self.dtype = hidden, dtype

    def forward(self, input_ids):
        return torch.zeros(*input_ids.shape, self.hidden, dtype=self.dtype, device=input_ids.device)


@dataclasses.dataclass(frozen=True)
class Stage:
    rank: int
    stages: int
    layers: range  # this stage's decoder layers (global indices)
    num_layers: int

    @property
    def first(self) -> bool:
        return self.rank == 0

    @property
    def last(self) -> bool:
        return self.rank == self.stages - 1

    def owner(self, layer: int) -> int:
        """The rank holding ``layer`` (the embedding output: the first stage)."""
        layer = max(layer, 0)
        return next(s for s in range(self.stages) if layer in stage_layers(s, self.stages, self.num_layers))


def _keep_stage(model: nn.Module, stage: Stage) -> None:
    """Drop what other stages hold, so this rank's memory is its stage's."""
    layers = decoder_layers(model)
    for i in range(len(layers)):
        if i not in stage.layers:
            layers[i] = _Skipped(layers[i])
    text = model.config.get_text_config()
    if not stage.first:
        model.set_input_embeddings(_Zeros(text.hidden_size, model.get_input_embeddings().weight.dtype))
    if not stage.last:
        model.set_output_embeddings(nn.Identity())
        if final_norm(model) is not None:
            model.get_decoder().norm = nn.Identity()


class StageRunner(HFRunner):
    """One pipeline stage. Rank 0's is the server's inner runner (wrapped by hf_parallel); every rank
    runs each call, and rank 0 returns the whole answer."""

    def __init__(self, model: nn.Module, stage: Stage, device: str, *, name: str, aux_layer_ids=None):
        super().__init__(model, name=name, aux_layer_ids=aux_layer_ids)  # info from the whole model
        self.stage, self.device = stage, device
        self._weights = _weight_specs(model)  # rank 0 receives the weights other stages hold
        self._layout, self._aliases = whole_layout(model)  # what a refresh's source must match
        self._head = self._norm = None  # held below only by the stage that keeps them
        _keep_stage(model, stage)
        self.model = model.to(device)
        self._layers = decoder_layers(model)
        if stage.last:
            self._head, self._norm = model.get_output_embeddings(), final_norm(model)
        self.info = dataclasses.replace(self.info, device=str(next(model.parameters()).device))

    def _pass(self, want: Capture) -> int:
        """The last layer any stage must run for ``want`` (-1: the embedding alone)."""
        if want.final_hidden or want.logits:
            return self.stage.num_layers - 1
        return max(want.layers)

    def _boundary_hooks(self, end: int, shape: torch.Size, to_end: bool) -> list:
        """Recv the hidden state before this stage's first layer, send it on after its last (or stop)."""
        stage, first = self.stage, self.stage.layers[0]

        def enter(_module, args, kwargs):
            if end < first:
                raise Stop
            if stage.first:
                return None
            hidden = torch.empty(shape, dtype=self.info.dtype, device=self.device)
            dist.recv(hidden, src=stage.rank - 1)
            return (hidden, *args[1:]), kwargs

        stop_at = min(stage.layers[-1], end)

        def leave(_module, _args, output):
            if stop_at < end:  # a later stage goes on from here
                dist.send(
                    (output[0] if isinstance(output, tuple) else output).contiguous(), dst=stage.rank + 1
                )
            if not to_end:
                raise Stop

        hooks = [self._layers[first].register_forward_pre_hook(enter, with_kwargs=True)]
        if stop_at >= first:
            hooks.append(self._layers[stop_at].register_forward_hook(leave))
        return hooks

    @torch.inference_mode()
    def capture(self, inputs: ForwardInputs, want: Capture) -> Captured:
        """This stage's part of one forward, then every capture gathered to rank 0 (None elsewhere)."""
        end, stage = self._pass(want), self.stage
        captured: dict[object, torch.Tensor] = {}
        output = None
        if stage.first or stage.layers[0] <= end:
            output = self._stage_forward(inputs, want, end, captured)
        return self._gather(want, captured, output, inputs.input_ids.shape)

    def _stage_forward(self, inputs: ForwardInputs, want: Capture, end: int, captured: dict):
        mask, packed = inputs.attention_mask, {}
        if inputs.packed:
            mask = block_causal_mask(inputs.seq_lens, inputs.input_ids.shape[1], self.info.dtype, mask.device)
            packed["position_ids"] = inputs.position_ids
        to_end = self.stage.last and (want.final_hidden or want.logits)
        mine = [i for i in want.layers if self.stage.owner(i) == self.stage.rank]
        hooks = [
            self._layers[i].register_forward_hook(keep(captured, i, stop=False))
            if i >= 0
            else embedding_output_point(self.model, keep(captured, i, stop=False))
            for i in mine
        ]  # before the boundary hooks, whose stop would skip them
        hooks += self._boundary_hooks(end, (*inputs.input_ids.shape, self.info.hidden_size), to_end)
        if to_end and want.final_hidden:
            hooks.append(self._head.register_forward_pre_hook(keep_input(captured, stop=not want.logits)))
        try:
            return self.model(input_ids=inputs.input_ids, attention_mask=mask, use_cache=False, **packed)
        except Stop:
            return None
        finally:
            for hook in hooks:
                hook.remove()

    def _gather(self, want: Capture, captured: dict, output, shape: torch.Size) -> Captured:
        """Each asked tensor to rank 0 from the rank that holds it, in the order rank 0 asks for them."""
        hidden, last = (*shape, self.info.hidden_size), self.stage.stages - 1
        parts = [self._to_rank_0(captured.get(i), self.stage.owner(i), hidden) for i in want.layers]
        final = self._to_rank_0(captured.get("final"), last, hidden) if want.final_hidden else None
        logits = output.logits if output is not None and want.logits else None
        if want.logits:  # in the dtype the model's head makes them (some upcast)
            logits = self._to_rank_0(logits, last, (*shape, self.info.vocab_size), self._logits_dtype(logits))
        if not self.stage.first:
            return Captured()
        return Captured(torch.cat(parts, dim=-1) if parts else None, final, logits)

    def _to_rank_0(self, value, owner: int, shape, dtype=None):
        """``value`` on rank 0 from ``owner``: sent by the owner, received by rank 0; None on other ranks."""
        rank = self.stage.rank
        if owner == 0:
            return value if rank == 0 else None
        if rank == owner:
            dist.send(value.contiguous(), dst=0)
        elif rank == 0:
            value = torch.empty(shape, dtype=dtype or self.info.dtype, device=self.device)
            dist.recv(value, src=owner)
            return value
        return None

    def _logits_dtype(self, logits) -> torch.dtype:
        """The last stage's logits dtype, told to rank 0 (the only other rank that needs it)."""
        last, box = self.stage.stages - 1, [logits.dtype if logits is not None else None]
        if last == 0:
            return box[0]
        if self.stage.rank == last:
            dist.send_object_list(box, dst=0)
        elif self.stage.first:
            dist.recv_object_list(box, src=last)
        return box[0]

    def weight(self, name: str) -> torch.Tensor:
        """A weight from the stage that holds it: the embedding on the first, lm_head and norm on the last."""
        owner = self.stage.stages - 1 if name in (WEIGHT_LM_HEAD, WEIGHT_FINAL_NORM) else 0
        mine = super().weight(name) if self.stage.rank == owner else None
        shape, dtype = self._weights[name]
        return self._to_rank_0(mine, owner, shape, dtype)

    def served_parts(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The whole model's layout, and this stage's tensors by the names a checkpoint gives them."""
        held = checkpoint_tensors(self.model)
        return self._layout, {self._aliases.get(name, name): tensor for name, tensor in held.items()}

    def input_embeddings(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight.detach() if self.stage.first else None

    def lm_head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        head = self.weight(WEIGHT_LM_HEAD)  # a collective: None on every rank but 0
        return head.index_select(0, ids) if head is not None else None


def _weight_specs(model: nn.Module) -> dict[str, tuple[torch.Size, torch.dtype]]:
    norm = final_norm(model)
    weights = {
        WEIGHT_INPUT_EMBEDDINGS: model.get_input_embeddings().weight,
        WEIGHT_LM_HEAD: model.get_output_embeddings().weight,
        WEIGHT_FINAL_NORM: norm.weight if norm is not None else None,
    }
    return {n: (w.shape, w.dtype) for n, w in weights.items() if w is not None}


def whole_layout(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The whole model's checkpoint tensors as meta tensors (their names, shapes, dtypes; no memory held), and
    each other name of a tied weight to the one a checkpoint keeps: a last stage's lm_head tied to the
    embedding the first stage holds is the checkpoint's embedding."""
    first: dict[int, str] = {}
    aliases = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if first.setdefault(id(tensor), name) != name:
            aliases[name] = first[id(tensor)]
    layout = {
        name: torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
        for name, tensor in checkpoint_tensors(model).items()
    }
    return layout, aliases


def load_stage(options: dict, rank: int, stages: int, device: str, dtype) -> StageRunner:
    """This rank's stage of the model in ``options`` (hf_parallel.node_options)."""
    module = load_pretrained(options["model"], dtype, options.get("trust_remote_code", False))
    if modalities(module):
        raise ValueError("the hf engine's pipeline parallel serves text-only models")
    layers = len(decoder_layers(module))
    stage = Stage(rank, stages, stage_layers(rank, stages, layers), layers)
    log.info("rank %d of %d holds decoder layers %d..%d", rank, stages, stage.layers[0], stage.layers[-1])
    return StageRunner(
        module, stage, device, name=options["name"], aux_layer_ids=options.get("aux_layer_ids")
    )
