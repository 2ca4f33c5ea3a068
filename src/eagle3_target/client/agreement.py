"""What a server and this client agreed when it joined: its model, the encoding, the p2p channel.

Made once per admission and never changed; a server that rejoins (after a
quarantine) gets a new agreement, and its old channel is closed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from eagle3_target.protocol import contract, encodings
from eagle3_target.protocol.features import CAN_PACKING, Features, supervision_request
from eagle3_target.protocol.model_info import ModelInfo

from .p2p import P2PChannel, wanted


@dataclass(frozen=True)
class Agreement:
    info: ModelInfo
    encoding: str = encodings.NEMO
    p2p: P2PChannel | None = None
    features: Features | None = None  # the feature request it can serve (checked at join)
    # The request is EAGLE-3's supervision of this server's own aux layers: asked as NeMo asks, in ``encoding``
    # (no features header), so a stock NeMo server gets NeMo's bytes and serves it.
    supervised: bool = False

    @classmethod
    def make(
        cls,
        url: str,
        info: ModelInfo,
        encoding: str,
        data_path: str,
        timeout: float,
        features: Features | Callable[[ModelInfo], Features] | None = None,
        packing: bool = False,
    ) -> Agreement:
        """The terms for a server offering ``info``: ``encoding`` as asked ("auto" allowed; EncodingError
        if it does not offer it), a p2p channel where ``data_path`` and its offer allow one, and
        ``features`` (or ``features(info)``) if it can serve them (FeatureError if not); with ``packing``, EncodingError unless
        it honours NeMo's packed rows."""
        if packing and CAN_PACKING not in (info.features or ()):
            raise encodings.EncodingError(
                f"{url} cannot compute packed rows (engine {info.engine or 'unknown'} offers no packing); "
                "packed training needs hf servers"
            )
        chosen = encodings.choose(encoding, encodings.offered(info), url)
        if callable(features):
            features = features(info)
        supervised = features is not None and features == supervision_request(info.aux_layer_ids)
        if features is not None and not supervised:
            features.check(info.num_hidden_layers, info.features, url)
        channel = P2PChannel(url, info, data_path, timeout=timeout) if wanted(info, data_path) else None
        return cls(info, chosen, channel, features, supervised)

    @property
    def dtype(self) -> torch.dtype | None:
        """The target dtype /model_info names; None where it names none (a stock NeMo server)."""
        dtype = getattr(torch, str(self.info.dtype), None)
        return dtype if isinstance(dtype, torch.dtype) else None

    def request_headers(self, features: Features | None = None) -> dict[str, str]:
        """What a /generate sends to ask for our encoding (nothing for NeMo's own), or for ``features``."""
        if features is not None:
            return {contract.FEATURES_HEADER: features.to_header()}
        return {} if self.encoding == encodings.NEMO else {contract.ENCODING_HEADER: self.encoding}

    def end(self) -> None:
        """Close what the agreement holds: its p2p group."""
        if self.p2p is not None:
            self.p2p.close()
