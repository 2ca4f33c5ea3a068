"""The target side of NeMo's other draft recipes (DSpark, EAGLE-1/2, P-EAGLE) on the fleet.

Each family asks the fleet for the target features its trainer consumes (decoder-layer outputs, the
post-norm last hidden state, full-vocabulary logits) and fetches once the target weights it copies or
applies on the trainer (input embeddings, lm_head). What NeMo's co-located wrapper derives from those
(left shifts, concatenations) is pure data movement, done here on the trainer's device, so a batch is
bit-identical to NeMo's when the fleet's forward is.
"""

from __future__ import annotations

import collections
from typing import Any

import torch

from .backend import split_options

EMBEDDINGS = "embed_tokens"  # the fleet's names for the weights a trainer may fetch
LM_HEAD = "lm_head"


def shift_left(tensor: torch.Tensor) -> torch.Tensor:
    """NeMo's ``_shift_left_with_zero``: drop the first position, append a zero one."""
    return torch.cat((tensor[:, 1:], torch.zeros_like(tensor[:, :1])), dim=1)


def open_backend(request: dict[str, Any], device: torch.device, settings: dict[str, Any]):
    """RemoteTargetBackend asking the fleet for ``request`` (Features' fields), from the remote_target
    section's settings (endpoints, auth_token and client options)."""
    from eagle3_target.protocol.features import Features

    from ..backend import RemoteTargetBackend

    options = dict(settings)
    endpoints = options.pop("endpoints", None)
    token = options.pop("auth_token", None)
    pool, backend_options = split_options(options)
    return RemoteTargetBackend(
        endpoints, auth_token=token, options=pool, device=device, features=Features(**request), **backend_options
    )


class FeatureHandle:
    """A pending capture whose ``result()`` is the family's target batch."""

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
    """NeMo's target-wrapper surface over a capture backend (RemoteTargetBackend with ``features``).

    Subclasses name what they ask for (``request``) and build the family's batch from the captured
    tensors (``to_batch``). Batches captured ahead (``prefetch``) are used in order by ``generate_batch``
    when the same input_ids come back, so a recipe whose loop fetches synchronously still overlaps the
    fleet's forward with its own step.
    """

    def __init__(self, remote, device: torch.device):
        self.remote = remote
        self.device = device
        self._weights: dict[str, torch.Tensor] = {}
        self._ahead: collections.deque = collections.deque()

    # -- what a family defines ----------------------------------------------------------------

    @staticmethod
    def request(**settings: Any) -> dict[str, Any]:
        raise NotImplementedError

    def to_batch(self, captured: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]):
        raise NotImplementedError

    # -- weights, fetched once --------------------------------------------------------------

    def weight(self, name: str) -> torch.Tensor:
        if name not in self._weights:
            self._weights[name] = self.remote.target_weight(name).to(self.device)
        return self._weights[name]

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return torch.nn.Embedding.from_pretrained(self.weight(EMBEDDINGS), freeze=True)

    def get_output_embeddings(self) -> torch.nn.Linear:
        weight = self.weight(LM_HEAD)
        head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
        head.weight = torch.nn.Parameter(weight, requires_grad=False)
        return head

    get_lm_head = get_output_embeddings  # EAGLE-1/2's name for it

    # -- batches ----------------------------------------------------------------------------

    def generate_batch_async(self, input_ids, attention_mask, loss_mask, **packing) -> FeatureHandle:
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask, **packing)
        wire_packing = {k: packing[k] for k in ("position_ids", "seq_lens") if packing.get(k) is not None}
        handle = self.remote.capture_async(input_ids, attention_mask, loss_mask, **wire_packing)
        return FeatureHandle(handle, lambda captured: self.to_batch(self._on_device(captured), inputs))

    @torch.no_grad()
    def generate_batch(self, input_ids, attention_mask, loss_mask, **packing):
        ids = input_ids.cpu()
        for i, (ahead_ids, _) in enumerate(self._ahead):
            if torch.equal(ahead_ids, ids):
                for _ in range(i):  # batches the loop skipped (an epoch cut short): never asked for again
                    self._ahead.popleft()[1].cancel()
                return self._ahead.popleft()[1].result()
        # Not fetched ahead (validation, or a loop without the prefetching loader): fetch it now.
        return self.generate_batch_async(input_ids, attention_mask, loss_mask, **packing).result()

    def prefetch(self, batch: dict[str, torch.Tensor]) -> None:
        """Start the capture of a dataloader batch that generate_batch will ask for later."""
        packing = {k: batch[k] for k in ("position_ids", "seq_lens", "doc_remaining") if k in batch}
        inputs = [batch[k].to(self.device) for k in ("input_ids", "attention_mask", "loss_mask")]
        handle = self.generate_batch_async(*inputs, **{k: v.to(self.device) for k, v in packing.items()})
        self._ahead.append((batch["input_ids"].cpu(), handle))

    def drop_prefetched(self) -> None:
        while self._ahead:
            self._ahead.popleft()[1].cancel()

    def _on_device(self, captured: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device, non_blocking=True) for k, v in captured.items()}

    # -- the rest of NeMo's backend surface --------------------------------------------------

    @property
    def supports_async(self) -> bool:
        return True

    @property
    def num_remote_servers(self) -> int:
        return max(1, self.remote.healthy_servers)

    def wait_for_servers(self, timeout: float = 60.0) -> int:
        return self.remote.wait_for_servers(timeout)

    def model_info(self) -> dict[str, Any]:
        return self.remote.model_info()

    def set_vocab_mapping(self, selected_token_ids: torch.Tensor, selected_token_mask: torch.Tensor) -> None:
        """These families project nothing onto a draft vocabulary on the fleet (NeMo's default no-op)."""

    def close(self) -> None:
        self.drop_prefetched()
        self.remote.close()


class PrefetchingLoader:
    """A dataloader that keeps up to ``depth`` batches' captures in flight (0 or 1: fetched one by one)."""

    def __init__(self, loader, target: FeatureTarget, depth: int):
        self.loader = loader
        self.target = target
        self.depth = depth

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str):
        return getattr(self.loader, name)  # sampler (set_epoch), dataset, ...

    def __iter__(self):
        waiting: collections.deque = collections.deque()
        for batch in self.loader:
            self.target.prefetch(batch)
            waiting.append(batch)
            if len(waiting) >= max(1, self.depth):
                yield waiting.popleft()
        while waiting:
            yield waiting.popleft()
