"""A pending feature capture on the trainer's side (RemoteTargetBackend.capture_async), and EAGLE-3's
supervision decoded on the caller's device, which a capture of it and generate_batch share."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable

import torch

from eagle3_target.protocol import encodings
from eagle3_target.protocol.contract import GENERATE_INPUT_KEYS, IMAGE_KEYS
from eagle3_target.protocol.features import CAN_PACKING, KEY_HIDDEN
from eagle3_target.protocol.model_info import ModelInfo

from .fetch import Reply
from .handles import PendingHandle
from .inputs import BatchInputs

OnDevice = Callable[[torch.Tensor, torch.device], torch.Tensor]  # a host tensor's (cached) copy on a device


def decoded(
    reply: Reply, input_ids: torch.Tensor, loss_mask: torch.Tensor, device: torch.device, on_device: OnDevice
) -> dict[str, torch.Tensor]:
    """EAGLE-3's five supervision tensors from a checked reply in its encoding, computed on ``device``: for
    "logits" the same ops, in the same dtype, as the server runs for "nemo", so bit-identical on one device."""
    tensors = {k: v.to(device, non_blocking=True) for k, v in reply.tensors.items()}
    rows = None if reply.head_rows is None else on_device(reply.head_rows, device)
    return encodings.decode(reply.encoding, tensors, input_ids.to(device), loss_mask.to(device), rows)


class CaptureHandle(PendingHandle):
    """A pending capture: ``result()`` blocks until the reply's tensors are on the caller's device.

    A server that served the request as EAGLE-3's supervision (Agreement.supervised) sent it in the agreed
    encoding: decoded here from the request's ``inputs``, its aux states named "hidden_states"."""

    def __init__(
        self,
        future: concurrent.futures.Future,
        device: torch.device,
        inputs: dict[str, torch.Tensor],
        on_device: OnDevice,
    ):
        super().__init__(future)
        self._device, self._inputs, self._on_device = device, inputs, on_device

    def result(self, timeout: float | None = None) -> dict[str, torch.Tensor]:
        """The checked reply by key, in the order Features.reply_keys names."""
        reply: Reply = self._pending.result(timeout)
        if reply.features is not None:
            return {k: v.to(self._device, non_blocking=True) for k, v in reply.tensors.items()}
        ids, loss = self._inputs["input_ids"], self._inputs["loss_mask"]
        supervision = decoded(reply, ids, loss, self._device, self._on_device)
        return {KEY_HIDDEN: supervision.pop("aux_hidden_states"), **supervision}


def image_inputs(
    reference: ModelInfo | None, images: dict[str, torch.Tensor] | None
) -> dict[str, torch.Tensor]:
    """An image-text batch's image tensors for the body, as the processor made them (bf16 stays bf16), on
    the CPU; only to a fleet whose targets take images (a text-only one answers 400 anyway)."""
    if not images:
        return {}
    unknown = sorted(set(images) - set(IMAGE_KEYS))
    if unknown:
        raise ValueError(f"unknown image inputs {unknown}; a batch's images are {', '.join(IMAGE_KEYS)}")
    if reference is None or "image" not in (reference.modalities or ()):
        raise ValueError("the target servers take text only: their /model_info lists no image modality")
    return {k: images[k].detach().to("cpu") for k in IMAGE_KEYS if images.get(k) is not None}


def check_packing(reference: ModelInfo | None) -> None:
    """Packing metadata goes only to a fleet that offers it: another would ignore it silently."""
    if reference is None or CAN_PACKING not in (reference.features or ()):
        raise ValueError(
            "the target servers do not offer packing (position_ids, seq_lens); send unpacked batches"
        )


def request_body(reference: ModelInfo | None, inputs: BatchInputs) -> dict[str, torch.Tensor]:
    """A feature request's tensors: the three NeMo inputs as int64 on the CPU, NeMo's packing metadata for a
    fleet that offers packing, and an image-text batch's processor outputs (its media) as they were made."""
    packing = {k: v for k, v in inputs.packing.items() if v is not None}
    if packing:
        check_packing(reference)
    if inputs.input_ids.dim() != 2:
        raise ValueError(f"input_ids must be a [B, S] matrix, got shape {list(inputs.input_ids.shape)}")
    given = (inputs.input_ids, inputs.attention_mask, inputs.loss_mask)
    body = dict(zip(GENERATE_INPUT_KEYS, given, strict=True))
    body = {k: t.detach().to("cpu", torch.int64) for k, t in {**body, **packing}.items()}
    return body | image_inputs(reference, inputs.media)
