"""A model-free runner: deterministic outputs of any shape, with an optional forward delay.

Used by benchmarks (a Llama-3.1-8B-shaped response without the model) and by
client tests (the content is a pure function of input_ids, so a test can check
every batch it gets back).
"""

from __future__ import annotations

import time

import torch

from .base import RunnerInfo, resolve_dtype


class SyntheticRunner:
    def __init__(
        self,
        *,
        num_hidden_layers: int = 32,
        hidden_size: int = 64,
        vocab_size: int = 512,
        aux_layer_ids: list[int] | None = None,
        dtype: str = "bfloat16",
        device: str = "cpu",
        forward_delay: float = 0.0,
        model: str | None = None,
    ):
        torch_dtype = resolve_dtype(dtype, device)
        self.info = RunnerInfo.build(
            model=model or "synthetic",
            engine="synthetic",
            num_hidden_layers=num_hidden_layers,
            hidden_size=hidden_size,
            vocab_size=vocab_size,
            aux_layer_ids=aux_layer_ids,
            dtype=torch_dtype,
            device=device,
            config={"hidden_size": hidden_size, "vocab_size": vocab_size, "num_hidden_layers": num_hidden_layers},
        )
        self.forward_delay = forward_delay
        self._vocab_ramp = torch.arange(vocab_size, device=device)
        self._aux_ramp = torch.arange(3 * hidden_size, device=device)
        self._embeddings = (torch.arange(vocab_size * hidden_size, device=device) % 97).view(
            vocab_size, hidden_size
        ).to(torch_dtype)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.forward_delay:
            time.sleep(self.forward_delay)
        ids = input_ids.unsqueeze(-1)
        logits = ((ids * 31 + self._vocab_ramp) % 101).to(self.info.dtype)
        aux = ((ids + self._aux_ramp) % 89).to(self.info.dtype)
        return logits, aux

    def input_embeddings(self) -> torch.Tensor:
        return self._embeddings

    def close(self) -> None:
        self._embeddings = None
