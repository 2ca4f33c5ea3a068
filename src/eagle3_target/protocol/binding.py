"""Binding a /generate reply to its request, and the checks a reply's values must pass.

Our client sends a request id (``contract.REQUEST_ID_HEADER``); a server that advertises
``request_binding`` in /model_info echoes it with the SHA-256 of the request body it computed on
(``contract.REQUEST_DIGEST_HEADER``), so a reply to another batch, or one a proxy crossed between
connections, is refused. A stock NeMo client sends no id and gets no extra header. Torch-free
except for the value checks, which take tensors.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

import torch

from . import contract
from .supervision import shift_left
from .wire import WireError

SCHEME = "sha256"  # what /model_info's request_binding names
_REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def digest(body: bytes | bytearray | memoryview) -> str:
    return f"{SCHEME}:{hashlib.sha256(body).hexdigest()}"


def valid_request_id(value: str | None) -> bool:
    return value is not None and _REQUEST_ID.fullmatch(value) is not None


def reply_headers(request_headers: Mapping[str, str], body: bytes | bytearray) -> dict[str, str]:
    """The server's echo for a request that carries a well-formed id; nothing for any other."""
    request_id = request_headers.get(contract.REQUEST_ID_HEADER)
    if not valid_request_id(request_id):
        return {}
    return {contract.REQUEST_ID_HEADER: request_id, contract.REQUEST_DIGEST_HEADER: digest(body)}


def check_echo(headers: Mapping[str, str], request_id: str, body_digest: str) -> None:
    """WireError unless ``headers`` echo this request's id and body digest."""
    got_id, got_digest = headers.get(contract.REQUEST_ID_HEADER), headers.get(contract.REQUEST_DIGEST_HEADER)
    if got_id != request_id:
        raise WireError(f"the reply answers request {str(got_id)[:80]!r}, not {request_id!r}")
    if got_digest != body_digest:
        raise WireError(f"the reply was computed on another request body (digest {str(got_digest)[:80]!r})")


def check_inputs_echo(tensors: Mapping[str, torch.Tensor], input_ids: torch.Tensor, loss_mask: torch.Tensor):
    """A "nemo" reply carries the request's input_ids and loss_mask shifted left: they must be ours."""
    for key, sent in (("input_ids", input_ids), ("loss_mask", loss_mask)):
        if not torch.equal(tensors[key], shift_left(sent)):
            raise WireError(f"the reply's {key} are not this request's: a reply to another batch")


def check_finite(tensors: Mapping[str, torch.Tensor]) -> None:
    """Supervision is finite: a correct server never sends NaN or infinity, and one would poison training."""
    for key, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise WireError(f"the reply's {key!r} holds NaN or infinite values")
