"""The target side of NeMo's recipes that take more than EAGLE-3's supervision (DSpark, EAGLE-1/2, P-EAGLE).

Each family asks the fleet for the target features its trainer consumes (decoder-layer outputs, the
post-norm last hidden state, full-vocabulary logits) and fetches once the target weights it copies or
applies on the trainer (input embeddings, lm_head). What NeMo's co-located wrapper derives from those
(left shifts, concatenations, the lm_head matmul) is done here on the trainer's device with the same
ops, so a batch is bit-identical to NeMo's when the fleet's forward is.
"""

from __future__ import annotations

from typing import Any

import torch

from eagle3_target.protocol.features import WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD, Features

from ..backend import RemoteTargetBackend
from .backend import split_options
from .prefetch import PrefetchedBatches, packing


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


def open_backend(features: Features, device: torch.device, remote_target: tuple[dict[str, Any], float]):
    """RemoteTargetBackend asking the fleet for ``features``, from RemoteTargetSection.remote_target,
    once every server that discovery found has joined (or failed to)."""
    kwargs, wait_timeout = remote_target
    options = dict(kwargs)
    endpoints, token = options.pop("endpoints"), options.pop("auth_token")
    pool, backend_kwargs = split_options(options)
    backend_kwargs.setdefault("device", device)
    backend = RemoteTargetBackend(
        endpoints, auth_token=token, options=pool, features=features, **backend_kwargs
    )
    try:
        backend.wait_for_servers(wait_timeout)
    except BaseException:
        backend.close()
        raise
    return backend


class FeatureHandle:
    """A pending capture whose ``result()`` is the family's target batch (NeMo's prefetch handle)."""

    def __init__(self, handle, finish):
        self._handle = handle
        self._finish = finish

    def done(self) -> bool:
        return self._handle.done()

    def cancel(self) -> bool:
        return self._handle.cancel()

    def result(self, timeout: float | None = None):
        return self._finish(self._handle.result(timeout))


class FeatureTarget:
    """NeMo's target-wrapper surface over RemoteTargetBackend's feature capture.

    A family subclass builds its batch from the captured tensors (``to_batch``). ``generate_batch``
    takes replies that a PrefetchingLoader asked for ahead (prefetch.py), in the loop's order.
    """

    def __init__(self, backend, device: torch.device, prefetch_depth: int | None = None):
        self.backend = backend
        self.device = device
        self.prefetched = PrefetchedBatches(backend, prefetch_depth)
        self._weights: dict[str, torch.Tensor] = {}

    def to_batch(self, captured: dict[str, torch.Tensor], inputs: dict[str, Any]):
        raise NotImplementedError

    # -- weights, fetched once onto the trainer's device --------------------------------------

    def weight(self, name: str) -> torch.Tensor:
        if name not in self._weights:
            self._weights[name] = self.backend.target_weight(name).to(self.device)
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

    def generate_batch_async(self, input_ids, attention_mask, loss_mask) -> FeatureHandle:
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask)
        handle = self.backend.capture_async(input_ids, attention_mask, loss_mask)
        return FeatureHandle(handle, lambda captured: self.to_batch(self._on_device(captured), inputs))

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
