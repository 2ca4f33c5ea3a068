"""NeMo's target-wrapper call as its recipes make it, written once for the trainer's one fleet target,
`FleetTarget` (fleet_target.py), whose family subclass turns one `BatchInputs` into NeMo's batch."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class BatchInputs:
    """One micro-batch as NeMo's loops hand it to their target: packed rows add position_ids, seq_lens and
    doc_remaining, DSpark's multimodal batches their media keys."""

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


class NeMoTarget:
    """Mixed in first: NeMo's ``generate_batch`` signature, as its recipes call it."""

    @torch.no_grad()
    def generate_batch(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        loss_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        doc_remaining: torch.Tensor | None = None,
        **media: torch.Tensor,
    ):
        inputs = BatchInputs(
            input_ids, attention_mask, loss_mask, position_ids, seq_lens, doc_remaining, media
        )
        return self.batch(inputs)

    def batch(self, inputs: BatchInputs):
        raise NotImplementedError(f"{type(self).__name__} builds no batch")

    @property
    def supports_async(self) -> bool:
        return True
