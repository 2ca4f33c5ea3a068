"""The runner seam: what the server needs from any engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch

from eagle3_target.protocol.encodings import EXACT_ENCODINGS
from eagle3_target.protocol.model_info import (
    ModelInfo,
    config_digest,
    default_aux_layer_ids,
    validate_aux_layer_ids,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """'auto' is NeMo's choice: bf16 on CUDA, fp32 elsewhere."""
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose auto, {', '.join(DTYPES)}") from None


class Packing(NamedTuple):
    """NeMo's packed rows: several documents per row, each attending only to itself (block-causal)."""

    position_ids: torch.Tensor  # [B, S] int64, restarting at 0 in each document
    seq_lens: torch.Tensor  # [B, D] int64, document lengths, 0-padded; each row sums to S


@dataclass(frozen=True)
class RunnerInfo:
    """The target's identity: everything a client must agree on before training against it."""

    model: str
    engine: str
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    aux_layer_ids: list[int]
    dtype: torch.dtype
    device: str
    config: dict[str, Any] = field(default_factory=dict)
    # "hidden" only from runners that are also a HiddenStateRunner
    encodings: tuple[str, ...] = EXACT_ENCODINGS
    # whether forward takes NeMo's packing metadata and computes under its block-causal mask
    packing: bool = False

    @classmethod
    def build(cls, *, aux_layer_ids: list[int] | None, num_hidden_layers: int, **fields) -> RunnerInfo:
        ids = default_aux_layer_ids(num_hidden_layers) if aux_layer_ids is None else aux_layer_ids
        return cls(
            num_hidden_layers=num_hidden_layers,
            aux_layer_ids=validate_aux_layer_ids(ids, num_hidden_layers),
            **fields,
        )

    @property
    def config_digest(self) -> str:
        return config_digest(self.config)

    def model_info(self, **per_server) -> ModelInfo:
        """What /model_info reports; ``per_server`` adds facts of this process (its p2p offer, ports)."""
        return ModelInfo(
            num_hidden_layers=self.num_hidden_layers,
            hidden_size=self.hidden_size,
            vocab_size=self.vocab_size,
            aux_layer_ids=tuple(self.aux_layer_ids),
            model=self.model,
            engine=self.engine,
            dtype=str(self.dtype).removeprefix("torch."),
            config_digest=self.config_digest,
            encodings=self.encodings,
            packing=self.packing,
            **per_server,
        )


@runtime_checkable
class TargetRunner(Protocol):
    """One frozen target. Calls are serialised by the server; forward runs off the event loop."""

    info: RunnerInfo

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, packing: Packing | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Unshifted full-vocab logits [B, S, V] and aux hidden states [B, S, 3H], on the runner's device.

        ``packing`` comes only to a runner whose info offers it (the service refuses it otherwise)."""
        ...

    def input_embeddings(self) -> torch.Tensor:
        """The input-embedding weight [V, H], whole."""
        ...

    def close(self) -> None:
        """Release the model and its device memory."""
        ...


@runtime_checkable
class HiddenStateRunner(TargetRunner, Protocol):
    """A runner whose logits are exactly lm_head(final hidden state): it can serve the "hidden" encoding.

    The server checks ``isinstance(runner, HiddenStateRunner)`` before it offers or uses "hidden".
    """

    def forward_hidden(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, packing: Packing | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """forward's logits and aux hidden states, plus the final normed hidden states [B, S, H]."""
        ...

    def lm_head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The lm_head weight rows of ``ids`` [len(ids), H], on the runner's device."""
        ...


class FinalHiddenRunner:
    """A runner that also captures the final normed hidden state: ``forward`` drops it."""

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, packing: Packing | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Runners that do not offer packing need not take the argument: it is passed only when given.
        extra = () if packing is None else (packing,)
        logits, aux, _ = self.forward_hidden(input_ids, attention_mask, *extra)
        return logits, aux
