"""A model-free runner: deterministic outputs of any shape, with an optional forward delay.

Used by benchmarks (a Llama-3.1-8B-shaped response without the model) and by
client tests (the content is a pure function of input_ids, so a test can check
every batch it gets back).
"""

from __future__ import annotations

import time

import torch

from eagle3_target.protocol.encodings import ENCODINGS
from eagle3_target.protocol.features import (
    CAN_DRAFT_PROBS,
    CAN_EMBEDDING,
    CAN_FINAL_HIDDEN,
    CAN_LAYERS,
    CAN_LOGITS,
    WEIGHT_INPUT_EMBEDDINGS,
    WEIGHT_LM_HEAD,
)

from .base import (
    Capture,
    Captured,
    FinalHiddenRunner,
    ForwardInputs,
    RunnerInfo,
    refuse_packing,
    resolve_dtype,
)


class SyntheticRunner(FinalHiddenRunner):
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
            encodings=ENCODINGS,
            config={
                "hidden_size": hidden_size,
                "vocab_size": vocab_size,
                "num_hidden_layers": num_hidden_layers,
            },
            features=(CAN_LAYERS, CAN_EMBEDDING, CAN_FINAL_HIDDEN, CAN_LOGITS, CAN_DRAFT_PROBS),
            weights=(WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD),
        )
        self.forward_delay = forward_delay
        # Row r of each table is the output for any token id congruent to r: a forward is one gather.
        # Logits are lm_head(hidden) computed in float32, so the "hidden" encoding has something to approximate.
        self._hidden_table = (
            (
                (torch.arange(101, device=device)[:, None] * 3 + torch.arange(hidden_size, device=device))
                % 13
                - 6
            )
            / 8
        ).to(torch_dtype)
        self._logits_table = torch.cat(
            [
                self._hidden_table.float() @ self._head_rows(rows).float().T
                for rows in torch.arange(vocab_size, device=device).split(4096)
            ],
            dim=1,
        ).to(torch_dtype)
        self._aux_table = torch.cat([self._layer_table(i) for i in self.info.aux_layer_ids], dim=-1)
        self._embeddings = (
            (torch.arange(vocab_size * hidden_size, device=device) % 97)
            .view(vocab_size, hidden_size)
            .to(torch_dtype)
        )

    def _layer_table(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s output for token id r (mod 89): ((r + 7 (layer + 1) + j) % 89), -1 the embeddings."""
        rows = torch.arange(89, device=self.info.device)[:, None] + 7 * (layer + 1)
        return ((rows + torch.arange(self.info.hidden_size, device=rows.device)) % 89).to(self.info.dtype)

    def _head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """lm_head[v, j] = ((5v + j) % 11 - 5) / 16, built on demand: no [V, H] weight is kept."""
        columns = torch.arange(self.info.hidden_size, device=ids.device)
        return (((ids[:, None] * 5 + columns) % 11 - 5) / 16).to(self.info.dtype)

    @torch.inference_mode()
    def forward_hidden(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.forward_delay:
            time.sleep(self.forward_delay)
        # aux and hidden and logits are rows of tables, looked up by id mod table size.
        row = input_ids % 101
        return self._logits_table[row], self._aux_table[input_ids % 89], self._hidden_table[row]

    @torch.inference_mode()
    def capture(self, inputs: ForwardInputs, want: Capture) -> Captured:
        refuse_packing(inputs, "synthetic")
        if self.forward_delay:
            time.sleep(self.forward_delay)
        ids = inputs.input_ids
        layers = None
        if want.layers:
            if list(want.layers) == self.info.aux_layer_ids:
                layers = self._aux_table[ids % 89]  # one gather, as forward's
            else:
                layers = torch.cat([self._layer_table(i)[ids % 89] for i in want.layers], dim=-1)
        row = ids % 101
        return Captured(
            hidden_states=layers,
            final_hidden=self._hidden_table[row] if want.final_hidden else None,
            logits=self._logits_table[row] if want.logits else None,
        )

    def lm_head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self._head_rows(ids)

    def weight(self, name: str) -> torch.Tensor:
        if name == WEIGHT_LM_HEAD:
            return self._head_rows(torch.arange(self.info.vocab_size, device=self.info.device))
        return self._embeddings

    def input_embeddings(self) -> torch.Tensor:
        return self._embeddings

    def close(self) -> None:
        self._embeddings = None
