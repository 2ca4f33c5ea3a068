"""One micro-batch as NeMo's loops hand it to their target, and NeMo's ``generate_batch`` arguments that make
it, written once for every trainer-side target: backend.py's RemoteTargetBackend and the recipes' fleet
targets (nemo/interface.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


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
