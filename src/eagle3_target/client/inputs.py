"""One micro-batch as NeMo's loops hand it to their target, and the two ways NeMo hands it over, each written
once for every trainer-side target (backend.py's RemoteTargetBackend, the recipes' fleet targets in
nemo/interface.py): ``generate_batch``'s arguments and a dataloader's batch dict."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from eagle3_target.protocol.contract import IMAGE_KEYS


@dataclass(frozen=True)
class BatchInputs:
    """Packed rows add position_ids, seq_lens and doc_remaining, DSpark's multimodal batches their media keys."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    doc_remaining: torch.Tensor | None = None
    media: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def packing(self) -> dict[str, torch.Tensor | None]:
        """What a server needs of NeMo's packing metadata (doc_remaining stays on the trainer)."""
        return {"position_ids": self.position_ids, "seq_lens": self.seq_lens}


def nemo_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    seq_lens: torch.Tensor | None = None,
    doc_remaining: torch.Tensor | None = None,
    **media: torch.Tensor,
) -> BatchInputs:
    """NeMo's ``generate_batch`` signature, as its recipes call their target."""
    return BatchInputs(input_ids, attention_mask, loss_mask, position_ids, seq_lens, doc_remaining, media)


def image_media(media: Mapping[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
    """An image-text batch's image tensors (contract.IMAGE_KEYS), as its processor made them; none for text."""
    return {k: media[k] for k in IMAGE_KEYS if media.get(k) is not None}


def batch_inputs(batch: Mapping[str, torch.Tensor]) -> BatchInputs:
    """A NeMo dataloader batch: its packing metadata when packed (``seq_lens`` present), its images if any."""
    packing = {}
    if "seq_lens" in batch:
        packing = {"position_ids": batch["position_ids"], "seq_lens": batch["seq_lens"]}
        packing["doc_remaining"] = batch.get("doc_remaining")
    return BatchInputs(
        batch["input_ids"], batch["attention_mask"], batch["loss_mask"], **packing, media=image_media(batch)
    )
