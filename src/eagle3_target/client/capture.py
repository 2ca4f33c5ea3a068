"""A pending feature capture on the trainer's side (RemoteTargetBackend.capture_async)."""

from __future__ import annotations

import concurrent.futures

import torch

from eagle3_target.protocol.features import CAN_PACKING
from eagle3_target.protocol.model_info import ModelInfo

from .fetch import Reply


class CaptureHandle:
    """A pending capture: ``result()`` blocks until the reply's tensors are on the caller's device."""

    def __init__(self, future: concurrent.futures.Future, device: torch.device):
        self._future = future
        self._device = device

    def done(self) -> bool:
        return self._future.done()

    def cancel(self) -> bool:
        return self._future.cancel()

    def result(self, timeout: float | None = None) -> dict[str, torch.Tensor]:
        """The checked reply by key, in the order Features.reply_keys names."""
        reply: Reply = self._future.result(timeout)
        return {k: v.to(self._device, non_blocking=True) for k, v in reply.tensors.items()}


def check_packing(reference: ModelInfo | None) -> None:
    """Packing metadata goes only to a fleet that offers it: another would ignore it silently."""
    if reference is None or CAN_PACKING not in (reference.features or ()):
        raise ValueError(
            "the target servers do not offer packing (position_ids, seq_lens); send unpacked batches"
        )
