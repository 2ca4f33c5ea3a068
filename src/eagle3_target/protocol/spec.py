"""Names and small codecs fixed by NeMo AutoModel's remote EAGLE-3 protocol, plus our negotiated extensions."""

from __future__ import annotations

import json
from collections.abc import Mapping

import torch

from .wire import CODE_TO_DTYPE, DTYPE_TO_CODE, WireError

# Endpoints (paths are "/" + name). NeMo's are POSTs but health; our livez, readyz and metrics are GETs.
HEALTH = "health"
HEARTBEAT = "heartbeat"
MODEL_INFO = "model_info"
INPUT_EMBEDDINGS = "input_embeddings"
SET_VOCAB_MAPPING = "set_vocab_mapping"
INIT_NCCL = "init_nccl"
GENERATE = "generate"
DISCONNECT = "disconnect"

# Our extensions: a NeMo client never calls them.
LIVEZ = "livez"
READYZ = "readyz"
METRICS = "metrics"
LM_HEAD = "lm_head"  # the lm_head rows of the session's draft vocabulary, for the "hidden" encoding

# The order in which supervision tensors are encoded and sent.
SUPERVISION_KEYS = ("aux_hidden_states", "target_probs", "position_mask", "input_ids", "loss_mask")
GENERATE_INPUT_KEYS = ("input_ids", "attention_mask", "loss_mask")
VOCAB_KEYS = ("selected_token_ids", "selected_token_mask")

# NeMo's data-plane header: request "my group is up", response "tensors follow".
NCCL_HEADER = "X-NeMo-NCCL"
# Our extension: names the caller's session; without it the peer address does.
SESSION_HEADER = "X-Eagle3-Session"
# Our extension: the transfer sequence number of a point-to-point /generate.
SEQUENCE_HEADER = "X-Eagle3-Seq"
# Our extension: the supervision encoding a /generate asks for and its reply carries (see encodings.py).
ENCODING_HEADER = "X-Eagle3-Encoding"

NCCL_GROUP_PREFIX = "nemo_eagle_target_transfer_"
# Our extension: /init_nccl {"auth": P2P_AUTH} asks for a per-group secret and a proven peer.
P2P_AUTH = "hmac-sha256"


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's default low/mid/high recipe: [1, L//2 - 1, L - 4]."""
    return [1, num_layers // 2 - 1, num_layers - 4]


def validate_aux_layer_ids(ids: list[int], num_layers: int) -> list[int]:
    ids = [int(i) for i in ids]
    if len(ids) != 3 or len(set(ids)) != 3:
        raise ValueError(f"aux_layer_ids must be three distinct layer ids, got {ids}")
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"aux_layer_ids {bad} out of range for a model with {num_layers} layers")
    return ids


def encode_metadata(tensors: Mapping[str, torch.Tensor | None]) -> bytes:
    """The JSON body of a point-to-point /generate response: key order and per-key dtype and shape."""
    metadata = {
        key: None if t is None else {"dtype_code": DTYPE_TO_CODE[t.dtype], "shape": list(t.shape)}
        for key, t in tensors.items()
    }
    return json.dumps({"keys_order": list(tensors), "metadata": metadata}).encode()


def decode_metadata(body: bytes) -> dict[str, tuple[torch.dtype, list[int]] | None]:
    """Parse the metadata JSON into key -> (dtype, shape) or None, in send order."""
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
