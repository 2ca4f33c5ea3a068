"""The JSON body of a p2p /generate reply: the key order and each tensor's dtype and shape.

The tensors themselves follow over the p2p group; the receiver allocates from this.
Dtype codes are the wire format's (wire.py), so both paths name dtypes alike.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import torch

from .wire import CODE_TO_DTYPE, DTYPE_TO_CODE, WireError

Metadata = Mapping[str, tuple[torch.dtype, list[int]] | None]


def encode_metadata(tensors: Mapping[str, torch.Tensor | None]) -> bytes:
    metadata = {
        key: None if t is None else {"dtype_code": DTYPE_TO_CODE[t.dtype], "shape": list(t.shape)}
        for key, t in tensors.items()
    }
    return json.dumps({"keys_order": list(tensors), "metadata": metadata}).encode()


def decode_metadata(body: bytes) -> dict[str, tuple[torch.dtype, list[int]] | None]:
    """Parse the metadata JSON into key -> (dtype, shape) or None, in send order; WireError if malformed."""
    try:
        doc = json.loads(body)
        out: dict[str, tuple[torch.dtype, list[int]] | None] = {}
        for key in doc["keys_order"]:
            meta = doc["metadata"][key]
            out[key] = (
                None if meta is None else (CODE_TO_DTYPE[meta["dtype_code"]], [int(d) for d in meta["shape"]])
            )
        return out
    except (ValueError, KeyError, TypeError) as exc:
        raise WireError(f"bad transfer metadata: {exc}") from exc
