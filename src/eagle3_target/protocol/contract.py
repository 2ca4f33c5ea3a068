"""What a target server promises its clients and its operator: names only, no torch.

NeMo AutoModel's remote EAGLE-3 protocol fixes the endpoints it calls and the
``X-NeMo-NCCL`` header; everything else here is our negotiated extension. The
operator imports this module to build probes and pod environments, so it must
stay free of torch (an import-linter contract checks that).
"""

from __future__ import annotations

import os
from pathlib import Path

# Endpoints (paths are "/" + name). NeMo's are POSTs but health; our livez, readyz and metrics are GETs.
HEALTH = "health"
HEARTBEAT = "heartbeat"
MODEL_INFO = "model_info"
INPUT_EMBEDDINGS = "input_embeddings"
SET_VOCAB_MAPPING = "set_vocab_mapping"
INIT_NCCL = "init_nccl"  # NeMo's name for setting up the p2p path
GENERATE = "generate"
DISCONNECT = "disconnect"

# Our extensions: a NeMo client never calls them.
LIVEZ = "livez"
READYZ = "readyz"
METRICS = "metrics"
LM_HEAD = "lm_head"  # the lm_head rows of the session's draft vocabulary, for the "hidden" encoding
WEIGHTS = "weights"  # /weights/<name>: a whole weight a trainer fetches once (features.py WEIGHT_NAMES)
SPECULATIVE_EVALUATE = (
    "/v1/speculative/evaluate"  # a draft's acceptance by speculative decoding (docs/evaluate.md)
)
# /weights/refresh: new weights served in place, for the holder of the admin token (--admin-token-file)
REFRESH = "weights/refresh"
# /weights/broadcast: the same, the tensors sent live by a trainer over a p2p group; then its outcome
BROADCAST = "weights/broadcast"
BROADCAST_OUTCOME = "weights/broadcast/outcome"

# What Kubernetes probes: /health answers 200 once the model is loaded (startup and readiness),
# /livez 200 while the process serves at all (liveness: a slow load is not a dead process).
READINESS_PATH = "/" + HEALTH
LIVENESS_PATH = "/" + LIVEZ
METRICS_PATH = "/" + METRICS

DEFAULT_PORT = 8001  # HTTP; NeMo's default too

# The order in which supervision tensors are encoded and sent.
SUPERVISION_KEYS = ("aux_hidden_states", "target_probs", "position_mask", "input_ids", "loss_mask")
GENERATE_INPUT_KEYS = ("input_ids", "attention_mask", "loss_mask")
VOCAB_KEYS = ("selected_token_ids", "selected_token_mask")
# Our extension: NeMo's sequence-packing metadata, both or neither, that a /generate body may add where
# /model_info offers "packing": position_ids [B, S] (per document) and seq_lens [B, D] (document lengths,
# 0-padded, each row summing to S). NeMo's doc_remaining only gates the trainer's loss: it stays there.
PACKING_KEYS = ("position_ids", "seq_lens")
# Our extension: an image-text target's image inputs as its processor made them, on a feature request to a
# server whose /model_info lists the "image" modality: pixel_values [patches, patch_dim] (any float dtype,
# sent as made), image_grid_thw int64 [images, 3], and optionally mm_token_type_ids [B, S].
IMAGE_KEYS = ("pixel_values", "image_grid_thw", "mm_token_type_ids")

# Our extension: a /generate's request id, and in the reply that id and the digest of the request body
# (see protocol/binding.py). Sent only by our client; a stock NeMo client sees no change.
REQUEST_ID_HEADER = "X-Eagle3-Request"
REQUEST_DIGEST_HEADER = "X-Eagle3-Request-Digest"

# NeMo's p2p header: request "my group is up", response "tensors follow".
NCCL_HEADER = "X-NeMo-NCCL"
# Our extension: names the caller's session; without it the peer address does.
SESSION_HEADER = "X-Eagle3-Session"
# Our extension: the transfer sequence number of a p2p /generate.
SEQUENCE_HEADER = "X-Eagle3-Seq"
# Our extension: the supervision encoding a /generate asks for and its reply carries (see encodings.py).
ENCODING_HEADER = "X-Eagle3-Encoding"
# Our extension: a feature request on /generate (features.py), echoed on its reply.
FEATURES_HEADER = "X-Eagle3-Features"
# Our extension: the version of the target weights that computed a /generate reply (model_info.target_version).
TARGET_VERSION_HEADER = "X-Eagle3-Target-Version"
# Our extension: the priority class of a /generate (low, normal, high), its share while sessions wait.
PRIORITY_HEADER = "X-Eagle3-Priority"
# Its classes and their weights: "high" gets twice the model's tokens of "normal" while both wait, "low" half.
PRIORITIES = {"low": 1, "normal": 2, "high": 4}

NCCL_GROUP_PREFIX = "nemo_eagle_target_transfer_"  # NeMo's p2p group name, then the port
# Our extension: /init_nccl {"auth": P2P_AUTH} asks for a per-group secret and a proven peer.
P2P_AUTH = "hmac-sha256"

# Environment the operator gives trainer pods, and the client reads.
SERVICE_ENV = "EAGLE3_TARGET_SERVICE"  # the endpoint spec (srv://...)
SERVICE_DNS_ENV = "EAGLE3_TARGET_SERVICE_DNS"  # the same fleet as dns://name:port, for NeMo-style clients
TOKEN_FILE_ENV = "EAGLE3_TARGET_AUTH_TOKEN_FILE"  # the bearer token's file
# Environment the operator gives target pods (informational: the server takes flags).
HTTP_PORT_ENV = "EAGLE3_TARGET_HTTP_PORT"
NCCL_PORT_RANGE_ENV = "EAGLE3_TARGET_NCCL_PORT_RANGE"


class TokenFileError(ValueError):
    """A bearer-token file that cannot be read or holds no token."""


def read_token_file(path: str | os.PathLike) -> str:
    """The bearer token in ``path``, stripped of surrounding whitespace.

    One rule for server and client alike: an unreadable file or one holding only
    whitespace is an error, never "no token" -- an empty token would silently turn
    authentication off on a server and send unauthenticated requests from a client.
    """
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"{path}: cannot read it: {exc}") from None
    if not token:
        raise TokenFileError(f"{path} is empty; put the bearer token in it")
    return token


def token_from_env() -> str | None:
    """The token in the file $EAGLE3_TARGET_AUTH_TOKEN_FILE names; None when it names none."""
    path = os.environ.get(TOKEN_FILE_ENV, "").strip()
    if not path:
        return None
    try:
        return read_token_file(path)
    except TokenFileError as exc:
        raise TokenFileError(f"${TOKEN_FILE_ENV}={exc}") from None
