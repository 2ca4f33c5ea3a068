"""The runner seam: what the server needs from any engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from eagle3_target.protocol.contract import IMAGE_KEYS
from eagle3_target.protocol.encodings import EXACT_ENCODINGS
from eagle3_target.protocol.features import (
    CAN_DRAFT_PROBS,
    CAN_EMBEDDING,
    CAN_FINAL_HIDDEN,
    CAN_LAYERS,
    CAN_LOGITS,
    Features,
)
from eagle3_target.protocol.model_info import (
    ModelInfo,
    config_digest,
    default_aux_layer_ids,
    validate_aux_layer_ids,
)

from ..errors import InvalidInput
from ..sampling import SamplingParams

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """'auto' is NeMo's choice: bf16 on CUDA, fp32 elsewhere."""
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose auto, {', '.join(DTYPES)}") from None


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
    # What capture() can give (protocol/features.py CAN_*) and which weights weight() hands out
    features: tuple[str, ...] = ()
    weights: tuple[str, ...] = ()
    # How the replica is split (ParallelLayout.describe()); {} on one device
    parallel: dict[str, int] = field(default_factory=dict)
    # Inputs besides text the target takes ("image"); empty for a text-only target
    modalities: tuple[str, ...] = ()
    # What image inputs must look like (hf_vlm.ImageSpec); None: the target takes no images
    image_spec: Any = None

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
            features=self.features,
            weights=self.weights,
            parallel=self.parallel,
            modalities=self.modalities or None,
            **per_server,
        )


@dataclass(frozen=True)
class ForwardInputs:
    """One batch for a forward. ``position_ids`` and ``seq_lens`` are NeMo's packing metadata
    ([B, S] and [B, max_docs]); a runner that cannot honour them refuses (``refuse_packing``)."""

    input_ids: torch.Tensor  # int64 [B, S], on the runner's device
    attention_mask: torch.Tensor  # [B, S]
    position_ids: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    # an image-text target's image inputs (server/images.py checked them), as its processor made them
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    mm_token_type_ids: torch.Tensor | None = None

    @property
    def images(self) -> dict[str, torch.Tensor]:
        return {k: v for k in IMAGE_KEYS if (v := getattr(self, k)) is not None}

    @property
    def packed(self) -> bool:
        return self.position_ids is not None or self.seq_lens is not None


@dataclass(frozen=True)
class Capture:
    """What one capture() must compute, and nothing more."""

    layers: tuple[int, ...] = ()  # decoder-layer outputs before the final norm; -1: the embedding output
    final_hidden: bool = False  # the post-norm last hidden state
    logits: bool = False  # full-vocabulary logits, unshifted

    @classmethod
    def of(cls, features: Features) -> Capture:
        return cls(features.layers, features.final_hidden, features.logits != "none")


@dataclass
class Captured:
    """capture()'s tensors, on the runner's device; None where not asked."""

    hidden_states: torch.Tensor | None = None  # [B, S, len(layers) * H], in the asked order
    final_hidden: torch.Tensor | None = None  # [B, S, H]
    logits: torch.Tensor | None = None  # [B, S, V]


def zero_capture(info: RunnerInfo, shape: torch.Size, want: Capture, device) -> Captured:
    """What a batch of empty rows captures: zeros of the asked shapes (packed-row engines run no prefill)."""

    def zeros(width: int) -> torch.Tensor:
        return torch.zeros(*shape, width, dtype=info.dtype, device=device)

    return Captured(
        zeros(len(want.layers) * info.hidden_size) if want.layers else None,
        zeros(info.hidden_size) if want.final_hidden else None,
        zeros(info.vocab_size) if want.logits else None,
    )


def refuse_packing(inputs: ForwardInputs, engine: str) -> None:
    if inputs.packed:
        raise InvalidInput("packing_not_offered", f"the {engine} engine cannot run packed sequences")


@runtime_checkable
class TargetRunner(Protocol):
    """One frozen target. Calls are serialised by the server; forward runs off the event loop."""

    info: RunnerInfo

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **packed: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Unshifted full-vocab logits [B, S, V] and aux hidden states [B, S, 3H], on the runner's device.

        ``packed``: position_ids and seq_lens of NeMo's packed rows, given only where ``info.features``
        offers packing (the service refuses them elsewhere)."""
        ...

    def input_embeddings(self) -> torch.Tensor:
        """The input-embedding weight [V, H], whole."""
        ...

    def capture(self, inputs: ForwardInputs, want: Capture) -> Captured:
        """One forward computing only ``want`` (what ``info.features`` offers); InvalidInput for the rest."""
        ...

    def weight(self, name: str) -> torch.Tensor:
        """A weight of ``info.weights`` (protocol/features.py WEIGHT_NAMES), whole."""
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
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """forward's logits and aux hidden states, plus the final normed hidden states [B, S, H]."""
        ...

    def lm_head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The lm_head weight rows of ``ids`` [len(ids), H], on the runner's device."""
        ...


class Decoding(Protocol):
    """One sequence an engine is generating (generation.py drives it in chunks, on the model thread)."""

    generated: list[int]  # the new tokens so far
    finish: str | None  # sampling.FINISH_STOP (an end-of-sequence token) or FINISH_LENGTH once it ends

    def advance(self, steps: int) -> list[int]:
        """Up to ``steps`` more tokens; the first call also runs the prompt."""
        ...


@runtime_checkable
class GeneratingRunner(TargetRunner, Protocol):
    """A runner that also generates text from the weights it serves supervision from (the /v1 endpoints)."""

    tokenizer: Any  # a transformers tokenizer, with the chat template; None: the target came without one

    def start_generation(self, prompt_ids: list[int], params: SamplingParams) -> Decoding:
        """A new sequence from ``prompt_ids``; nothing runs until its first advance()."""
        ...


class FinalHiddenRunner:
    """A runner that also captures the final normed hidden state: ``forward`` drops it."""

    # The features such a runner's forward_hidden serves (packing is each engine's own to offer)
    FEATURES = (CAN_LAYERS, CAN_EMBEDDING, CAN_FINAL_HIDDEN, CAN_LOGITS, CAN_DRAFT_PROBS)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **packed: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # packed (position_ids, seq_lens) only comes to a runner whose features offer packing
        logits, aux, _ = self.forward_hidden(input_ids, attention_mask, **packed)
        return logits, aux
