"""EAGLE-3's fleet target, `NeMoTargetBackend`: NeMo's remote EAGLE-3 target as a FleetTarget over ``capture``,
like every family's.

Its request is EAGLE-3's supervision of the fleet's own aux layers (protocol/families/eagle3.py), which
NeMo's remote target takes from its servers. Asked of a server whose aux layers they are, that request is
sent as NeMo's own /generate in the negotiated encoding (client/agreement.py), so a stock NeMo server
gets NeMo's bytes and the fleet may be NeMo's servers, ours, or both. It opens with NeMo's remote target's
constructor (endpoints), for NeMo's own recipe or trainer loop and TrainEagle3Recipe.
"""

from __future__ import annotations

from typing import Any

import torch

from eagle3_target.protocol.families import family

from ..endpoints import default_spec, read_auth_token
from ._imports import nemo_module
from .fleet_target import FleetTarget, open_backend
from .interface import BatchInputs
from .ranks import fetched_once
from .remote import RemoteTargetSettings

Eagle3TargetBackend = nemo_module("components.speculative.eagle.backend").Eagle3TargetBackend
Eagle3TargetBatch = nemo_module("components.speculative.eagle.target").Eagle3TargetBatch


class NeMoTargetBackend(FleetTarget, Eagle3TargetBackend):
    """A drop-in for NeMo's RemoteEagle3TargetModel with discovery, failover, sessions and auth underneath: the
    FleetTarget whose batch is NeMo's Eagle3TargetBatch from EAGLE-3's capture, opened from endpoints as NeMo's
    remote target is.

    ``endpoints``: a spec or list of specs, as RemoteTargetBackend takes (default: $EAGLE3_TARGET_SERVICE).
    ``auth_token``: default: the file named by $EAGLE3_TARGET_AUTH_TOKEN_FILE.
    ``options``: PoolOptions fields (``max_in_flight``, ``deadline``, ...) and RemoteTargetBackend's
    keyword arguments (``nameserver``, ``device``, ...), in one flat set, as a YAML section gives them:
    ``encoding="logits"`` asks for the compact, bit-identical reply encoding (docs/server.md).
    ``ranks_share_weights``: the input embeddings cross the network once per torchrun job (ranks.py).
    Returns once the first server is ready; ``wait_for_servers`` waits for the rest.
    """

    def __init__(
        self,
        endpoints: str | list[str] | None = None,
        auth_token: str | None = None,
        *,
        ranks_share_weights: bool = False,
        **options: Any,
    ):
        settings = RemoteTargetSettings(
            endpoints or default_spec(), auth_token or read_auth_token(), options, wait_timeout=0.0
        )
        device = torch.device(options["device"]) if options.get("device") is not None else None
        backend, weights = open_backend(family("eagle3"), device, settings, layers=None, fetch_weights=False)
        super().__init__(backend, weights, device, settings)
        self._ranks_share_weights = ranks_share_weights

    def get_input_embeddings(self) -> torch.nn.Embedding:
        """NeMo's /input_embeddings (a stock NeMo server has it too), fetched when first asked. Every rank of a
        torchrun job asks in NeMo's setup: with ``ranks_share_weights``, rank 0 fetches for all."""
        if not self._ranks_share_weights:
            return self.backend.get_input_embeddings()
        if "embeddings" not in self._modules:
            device = self.backend.device or torch.device("cpu")
            weight = fetched_once(lambda: self.backend.get_input_embeddings().weight, device)
            self._modules["embeddings"] = torch.nn.Embedding.from_pretrained(weight.to(device), freeze=True)
        return self._modules["embeddings"]

    def to_batch(self, captured: dict[str, torch.Tensor], inputs: BatchInputs) -> Eagle3TargetBatch:
        mask = inputs.attention_mask if self.device is None else inputs.attention_mask.to(self.device)
        return Eagle3TargetBatch(
            aux_hidden_states=captured["hidden_states"],
            input_ids=captured["input_ids"],
            attention_mask=mask,  # the caller's own, as NeMo returns it
            loss_mask=captured["loss_mask"],
            target_probs=captured["target_probs"],
            position_mask=captured["position_mask"],
            # NeMo's packing metadata, the caller's own (unshifted), for its trainer
            position_ids=inputs.position_ids,
            seq_lens=inputs.seq_lens,
            doc_remaining=inputs.doc_remaining,
        )

    def set_vocab_mapping(self, selected_token_ids: torch.Tensor, selected_token_mask: torch.Tensor) -> None:
        """Sent to every server now and to every server that joins later: draft_probs project onto it."""
        self.backend.set_vocab_mapping(selected_token_ids, selected_token_mask)

    def model_info(self) -> dict[str, Any]:
        return self.backend.model_info()

    def wait_for_servers(self, timeout: float = 60.0) -> int:
        return self.backend.wait_for_servers(timeout)
