"""The target side of NeMo's recipes that take more than EAGLE-3's supervision (DSpark, EAGLE-1/2, P-EAGLE).

Each family asks the fleet for the target features its trainer consumes (decoder-layer outputs, the
post-norm last hidden state, full-vocabulary logits) and fetches once per job, at setup, the target
weights it copies or applies on the trainer (input embeddings, lm_head: its family's ``weights``, however
many ranks run; ranks.py). What NeMo's co-located wrapper derives from those (left shifts,
concatenations, the lm_head matmul) is done here on the trainer's device with the same ops, so a batch
is bit-identical to NeMo's when the fleet's forward is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from eagle3_target.protocol.families import Family
from eagle3_target.protocol.features import WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD

from ..backend import RemoteTargetBackend
from ..handles import MappedHandle
from .backend import split_options
from .prefetch import PrefetchedBatches, packing
from .ranks import fetched_weights


def shift_left(tensor: torch.Tensor) -> torch.Tensor:
    """NeMo's ``_shift_left_with_zero``: drop the first position, append a zero one."""
    return torch.cat((tensor[:, 1:], torch.zeros_like(tensor[:, :1])), dim=1)


def dspark_context(
    captured: dict[str, torch.Tensor], target_layer_ids: list[int], num_layers: int
) -> torch.Tensor:
    """NeMo's DSpark context [B, S, n*H] from what the dspark family asks (its ask() sends the last layer,
    whose feature is the post-norm state, once as final_hidden): the layers in order, the post-norm state
    in the last layer's place (a copy: exact)."""
    final = captured["final_hidden"]
    width, start, pieces = final.shape[-1], 0, []
    for layer_id in target_layer_ids:
        if layer_id == num_layers - 1:
            pieces.append(final)
        else:
            pieces.append(captured["hidden_states"][..., start : start + width])
            start += width
    return torch.cat(pieces, dim=-1)


def one_time_weights(family: Family, compact: bool) -> tuple[str, ...]:
    """The weights a family's trainer reads: those it declares, and the lm_head a compact request applies."""
    extra = (WEIGHT_LM_HEAD,) if compact and WEIGHT_LM_HEAD not in family.weights else ()
    return family.weights + extra


def open_backend(
    family: Family,
    device: torch.device,
    remote_target: tuple[dict[str, Any], float],
    layers: Sequence[int] = (),
    num_layers: int = 0,
    compact: bool = False,
) -> tuple[RemoteTargetBackend, dict[str, torch.Tensor]]:
    """RemoteTargetBackend asking the fleet for what ``family`` asks (its compact request if ``compact``),
    from RemoteTargetSection.remote_target, once every server that discovery found has joined (or failed
    to); and the family's one-time weights on ``device``, fetched once per job however many ranks run."""
    kwargs, wait_timeout = remote_target
    options = dict(kwargs)
    endpoints, token = options.pop("endpoints"), options.pop("auth_token")
    pool, backend_kwargs = split_options(options)
    backend_kwargs.setdefault("device", device)
    features = (family.compact if compact else family.ask)(layers, num_layers)
    backend = RemoteTargetBackend(
        endpoints, auth_token=token, options=pool, features=features, **backend_kwargs
    )
    try:
        backend.wait_for_servers(wait_timeout)
        return backend, fetched_weights(backend, one_time_weights(family, compact), device)
    except BaseException:
        backend.close()
        raise


class FeatureTarget:
    """NeMo's target-wrapper surface over RemoteTargetBackend's feature capture.

    A family subclass builds its batch from the captured tensors (``to_batch``). ``generate_batch``
    takes replies that a PrefetchingLoader asked for ahead (prefetch.py), in the loop's order.
    """

    def __init__(
        self,
        backend,
        weights: dict[str, torch.Tensor],
        device: torch.device,
        prefetch_depth: int | None = None,
    ):
        self.backend = backend
        self.device = device
        self.prefetched = PrefetchedBatches(backend, prefetch_depth)
        self._weights = weights  # open_backend's, fetched at setup on every rank alike

    def to_batch(self, captured: dict[str, torch.Tensor], inputs: dict[str, Any]):
        raise NotImplementedError

    # -- weights, fetched once per job onto the trainer's device at setup ----------------------

    def weight(self, name: str) -> torch.Tensor:
        # Never fetched here, later: under torchrun a fetch is a collective every rank must join at once.
        if name not in self._weights:
            raise KeyError(
                f"target weight {name!r} is not one this family fetches ({', '.join(self._weights)})"
            )
        return self._weights[name]

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return torch.nn.Embedding.from_pretrained(self.weight(WEIGHT_INPUT_EMBEDDINGS), freeze=True)

    def get_output_embeddings(self) -> torch.nn.Linear:
        weight = self.weight(WEIGHT_LM_HEAD)
        head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
        head.weight = torch.nn.Parameter(weight, requires_grad=False)
        return head

    get_lm_head = get_output_embeddings  # EAGLE-1/2's name for it

    # -- batches --------------------------------------------------------------------------------

    @torch.no_grad()
    def generate_batch(self, input_ids, attention_mask, loss_mask, **packed):
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask, **packed)
        captured = self.prefetched.take(input_ids, attention_mask, loss_mask, **packing(packed))
        return self.to_batch(self._on_device(captured), inputs)

    def generate_batch_async(self, input_ids, attention_mask, loss_mask) -> MappedHandle:
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask)
        handle = self.backend.capture_async(input_ids, attention_mask, loss_mask)
        return MappedHandle(handle, lambda captured: self.to_batch(self._on_device(captured), inputs))

    def _on_device(self, captured: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device, non_blocking=True) for k, v in captured.items()}

    # -- the rest of NeMo's backend surface ---------------------------------------------------

    @property
    def supports_async(self) -> bool:
        return True

    @property
    def num_remote_servers(self) -> int:
        """Healthy servers now; NeMo's EAGLE-3 loop caps its prefetch depth at this."""
        return max(1, self.backend.healthy_servers)

    def set_vocab_mapping(self, selected_token_ids: torch.Tensor, selected_token_mask: torch.Tensor) -> None:
        """These families project nothing onto a draft vocabulary on the fleet (NeMo's default no-op)."""

    def close(self) -> None:
        self.prefetched.cancel()
        self.backend.close()
