"""NeMoTargetBackend: NeMo's Eagle3TargetBackend contract, served by the fleet through RemoteTargetBackend."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ..backend import RemoteTargetBackend, TargetBatch
from ..handles import MappedHandle
from ..options import PoolOptions
from ._imports import nemo_module
from .interface import BatchInputs, NeMoTarget
from .ranks import fetched_once

Eagle3TargetBackend = nemo_module("components.speculative.eagle.backend").Eagle3TargetBackend
Eagle3TargetBatch = nemo_module("components.speculative.eagle.target").Eagle3TargetBatch

# What NeMo's packed dataloader adds to a batch and its co-located target takes
PACKING_BATCH_KEYS = ("position_ids", "seq_lens", "doc_remaining")
POOL_OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(PoolOptions))
BACKEND_OPTION_NAMES = frozenset(inspect.signature(RemoteTargetBackend).parameters) - {
    "endpoints",
    "auth_token",
    "options",
}


def split_options(options: dict[str, Any]) -> tuple[PoolOptions, dict[str, Any]]:
    """One flat set of client options -> (PoolOptions, RemoteTargetBackend keyword arguments)."""
    unknown = set(options) - POOL_OPTION_NAMES - BACKEND_OPTION_NAMES
    if unknown:
        known = ", ".join(sorted(POOL_OPTION_NAMES | BACKEND_OPTION_NAMES))
        raise ValueError(f"unknown client option(s) {', '.join(sorted(unknown))}; known: {known}")
    pool = PoolOptions(**{k: v for k, v in options.items() if k in POOL_OPTION_NAMES})
    return pool, {k: v for k, v in options.items() if k not in POOL_OPTION_NAMES}


def to_nemo_batch(batch: TargetBatch) -> Eagle3TargetBatch:
    return Eagle3TargetBatch(**batch.as_dict())


class NeMoTargetBackend(NeMoTarget, Eagle3TargetBackend):
    """A drop-in for NeMo's RemoteEagle3TargetModel with discovery, failover, sessions and auth underneath.

    ``endpoints``: a spec or list of specs, as RemoteTargetBackend takes (default: $EAGLE3_TARGET_SERVICE).
    ``auth_token``: default: the file named by $EAGLE3_TARGET_AUTH_TOKEN_FILE.
    ``options``: PoolOptions fields (``max_in_flight``, ``deadline``, ...) and RemoteTargetBackend's
    keyword arguments (``nameserver``, ``device``, ...), in one flat set, as a YAML section gives them:
    ``encoding="logits"`` asks for the compact, bit-identical reply encoding (docs/server.md).
    """

    def __init__(
        self,
        endpoints: str | list[str] | None = None,
        auth_token: str | None = None,
        *,
        ranks_share_weights: bool = False,
        **options: Any,
    ):
        pool, backend_options = split_options(options)
        self.remote = RemoteTargetBackend(endpoints, auth_token=auth_token, options=pool, **backend_options)
        self._noted: tuple[torch.Tensor, dict[str, torch.Tensor]] | None = None
        # every rank of a torchrun job calls get_input_embeddings in NeMo's setup: rank 0 fetches for all
        self._ranks_share_weights = ranks_share_weights
        self._embeddings: torch.nn.Embedding | None = None

    @property
    def num_remote_servers(self) -> int:
        """Healthy servers now; NeMo caps its prefetch depth at this, so call wait_for_servers() first."""
        return max(1, self.remote.healthy_servers)

    def wait_for_servers(self, timeout: float = 60.0) -> int:
        return self.remote.wait_for_servers(timeout)

    def model_info(self) -> dict[str, Any]:
        return self.remote.model_info()

    def set_vocab_mapping(self, selected_token_ids: torch.Tensor, selected_token_mask: torch.Tensor) -> None:
        self.remote.set_vocab_mapping(selected_token_ids, selected_token_mask)

    def get_input_embeddings(self) -> torch.nn.Embedding:
        if not self._ranks_share_weights:
            return self.remote.get_input_embeddings()
        if self._embeddings is None:
            device = self.remote.device or torch.device("cpu")
            weight = fetched_once(lambda: self.remote.get_input_embeddings().weight, device)
            self._embeddings = torch.nn.Embedding.from_pretrained(weight.to(device), freeze=True)
        return self._embeddings

    def batch(self, inputs: BatchInputs) -> Eagle3TargetBatch:
        """NeMo's generate_batch (interface.py): its async twin, waited for."""
        packing = dict(inputs.packing, doc_remaining=inputs.doc_remaining)
        return self.generate_batch_async(
            inputs.input_ids, inputs.attention_mask, inputs.loss_mask, **packing
        ).result()

    def generate_batch_async(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor, **packing
    ) -> MappedHandle:
        """The handle NeMo's prefetch loop expects: ``result()`` gives an Eagle3TargetBatch. NeMo's loop passes
        only the first three; a packed batch's metadata comes from ``noting_packing``."""
        if packing.get("seq_lens") is None and self._noted is not None and self._noted[0] is input_ids:
            packing = self._noted[1]
        return MappedHandle(
            self.remote.generate_batch_async(input_ids, attention_mask, loss_mask, **packing), to_nemo_batch
        )

    def noting_packing(self, batches: Iterable[dict[str, torch.Tensor]]) -> Iterator[dict[str, torch.Tensor]]:
        """NeMo's dataloader batches, each packed one's metadata noted under its input_ids: NeMo's prefetch
        loop hands generate_batch_async only input_ids, attention_mask and loss_mask, right after each batch."""
        for batch in batches:
            if "seq_lens" in batch:
                self._noted = (batch["input_ids"], {k: batch[k] for k in PACKING_BATCH_KEYS})
            yield batch

    def close(self) -> None:
        self.remote.close()

    def __enter__(self) -> NeMoTargetBackend:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
