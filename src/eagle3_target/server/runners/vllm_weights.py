"""The vllm engine's weights, which live in vLLM's workers: read out through ``collective_rpc`` (the input
embeddings, the lm_head and its draft-vocabulary rows, the final norm), and replaced in place by vLLM's own
``reload_weights`` on every rank (POST /weights/refresh, refresh.py)."""

from __future__ import annotations

import torch

from eagle3_target.protocol.features import WEIGHT_INPUT_EMBEDDINGS

from .hf_weights import file_layout
from .vllm_capture import embedding_shard, head_rows, head_shard


class VLLMWeights:
    """VLLMRunner's weight calls (``self.llm``: its engine; ``self.info``: its RunnerInfo)."""

    refreshed = False  # whether the weights served are no longer the checkpoint's the engine was built from

    def served_layout(self) -> dict[str, torch.Tensor]:
        """What a refresh's source must match: the served checkpoint's layout (vLLM's workers hold the weights)."""
        return file_layout(self.info.model, "vllm")

    def replace_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """vLLM's own in-place reload on every rank, each taking its part, between prefills (the model thread)."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(tensors.items())})
        self.refreshed = True

    def weight(self, name: str) -> torch.Tensor:
        if name == WEIGHT_INPUT_EMBEDDINGS:
            return self.input_embeddings()
        # The last stage's: the lm_head's shards of the real vocabulary in rank order, or the final norm.
        return torch.cat([w for w in self.llm.collective_rpc(head_shard, args=(name,)) if w is not None])

    def lm_head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        parts = [p for p in self.llm.collective_rpc(head_rows, args=(ids,)) if p is not None]
        if len(parts) == 1:
            return parts[0]["rows"]
        rows = parts[0]["rows"].new_empty(len(ids), parts[0]["rows"].shape[-1])
        for part in parts:  # each vocabulary shard fills the rows it holds
            rows[part["mask"]] = part["rows"]
        return rows

    def input_embeddings(self) -> torch.Tensor:
        # vLLM pads (and under tensor parallelism shards) the embedding rows: whole real vocabulary only.
        return torch.cat([w for w in self.llm.collective_rpc(embedding_shard) if w is not None])
