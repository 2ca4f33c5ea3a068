"""Supervision encodings: what a /generate reply carries, negotiated per server.

- "nemo": the five supervision tensors exactly as NeMo sends them. The default: a
  client that does not ask (every stock NeMo client) gets nothing else.
- "logits": aux states, the draft-vocabulary logits of positions 1..S-1 in the
  target's dtype, and position_mask as bits. The client has input_ids and loss_mask
  already and builds target_probs with supervision.assemble, the function the
  server uses for "nemo": bit-identical on the same device.
- "hidden": aux states, the final normed hidden states of positions 1..S-1 and the
  position bits. The client applies the lm_head rows of the draft vocabulary
  (fetched once per mapping from /lm_head) and the same assemble: approximate, the
  matmul's reduction order differs. Only for targets whose logits are exactly
  lm_head(hidden): no softcapping or scaling after the head.

A client asks with the X-Eagle3-Encoding header on /generate; the server echoes it.
Neither compact encoding makes the server build float32 probabilities.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from .choices import AUTO, ENCODINGS, HIDDEN, LOGITS, NEMO
from .choices import ENCODING_CHOICES as CHOICES
from .model_info import ModelInfo
from .supervision import VocabMapping, assemble, build_supervision, draft_logits_tail, position_mask
from .wire import WireError

EXACT_ENCODINGS = (NEMO, LOGITS)  # what a target with logit post-processing offers

Expected = dict[str, tuple[torch.dtype | None, tuple[int, ...]]]


class EncodingError(ValueError):
    """An encoding that does not exist, or that a server does not offer."""


def offered(info: ModelInfo) -> list[str]:
    """The encodings a server sends that we know; one that predates them sends only "nemo"."""
    return [NEMO] if info.encodings is None else [n for n in info.encodings if n in ENCODINGS]


def choose(requested: str, offers: Sequence[str], server: str = "the server") -> str:
    """The encoding to ask ``server`` for: "auto" takes the most compact exact one it offers."""
    if requested == AUTO:
        return LOGITS if LOGITS in offers else NEMO
    if requested not in ENCODINGS:
        raise EncodingError(f"unknown encoding {requested!r}; choose {', '.join(CHOICES)}")
    if requested not in offers:
        raise EncodingError(
            f"{server} does not offer encoding {requested!r} (it offers {', '.join(offers)})"
            + (
                "; its target post-processes logits, so only exact encodings are offered"
                if requested == HIDDEN and LOGITS in offers
                else ""
            )
        )
    return requested


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """A bool tensor as uint8 [ceil(n / 8)], element i at bit i % 8 of byte i // 8."""
    flat = mask.reshape(-1).to(torch.uint8)
    flat = F.pad(flat, (0, -flat.numel() % 8))
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=mask.device)
    return (flat.view(-1, 8) * weights).sum(-1, dtype=torch.uint8)


def unpack_bits(bits: torch.Tensor, count: int) -> torch.Tensor:
    """The first ``count`` bits of ``pack_bits``' output, as bool [count]."""
    shifts = torch.arange(8, dtype=torch.uint8, device=bits.device)
    return ((bits[:, None] >> shifts) & 1).bool().reshape(-1)[:count]


@torch.inference_mode()
def encode(
    encoding: str,
    logits: torch.Tensor,
    aux_hidden_states: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    vocab: VocabMapping,
    final_hidden: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The server's reply tensors for one forward, in send order."""
    if encoding == NEMO:
        return build_supervision(logits, aux_hidden_states, input_ids, loss_mask, vocab)
    out = {"aux_hidden_states": aux_hidden_states}
    if encoding == LOGITS:
        out["draft_logits"] = draft_logits_tail(logits, vocab)
    elif encoding == HIDDEN:
        if final_hidden is None:
            raise EncodingError("encoding 'hidden' needs the final hidden states")
        out["final_hidden"] = final_hidden[:, 1:]
    else:
        raise EncodingError(f"unknown encoding {encoding!r}")
    out["position_bits"] = pack_bits(position_mask(logits, loss_mask, vocab))
    return out


def expected(
    encoding: str, batch: int, seq: int, hidden_size: int, draft_vocab: int, dtype: torch.dtype | None
) -> Expected:
    """Per reply key: its dtype (None: not known to the client) and shape."""
    aux = {"aux_hidden_states": (dtype, (batch, seq, 3 * hidden_size))}
    bits = {"position_bits": (torch.uint8, (-(-batch * seq // 8),))}
    if encoding == LOGITS:
        return {**aux, "draft_logits": (dtype, (batch, seq - 1, draft_vocab)), **bits}
    if encoding == HIDDEN:
        return {**aux, "final_hidden": (dtype, (batch, seq - 1, hidden_size)), **bits}
    return {
        **aux,
        "target_probs": (torch.float32, (batch, seq, draft_vocab)),
        "position_mask": (torch.bool, (batch, seq, 1)),
        "input_ids": (torch.int64, (batch, seq)),
        "loss_mask": (torch.int64, (batch, seq)),
    }


def check(tensors: Mapping[str, torch.Tensor | None], want: Expected) -> None:
    """Raise WireError unless every expected key is there with its dtype and shape."""
    for key, (dtype, shape) in want.items():
        tensor = tensors.get(key)
        if tensor is None:
            raise WireError(
                f"reply lacks {key!r} (has {sorted(k for k, v in tensors.items() if v is not None)})"
            )
        if tuple(tensor.shape) != shape or (dtype is not None and tensor.dtype != dtype):
            raise WireError(
                f"reply {key!r} is {tensor.dtype} {list(tensor.shape)}, expected {dtype or 'any'} {list(shape)}"
            )


@torch.no_grad()  # not inference_mode: a trainer's loss saves these for backward, which inference tensors refuse
def decode(
    encoding: str,
    tensors: Mapping[str, torch.Tensor],
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    head_rows: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The five supervision tensors from a checked reply, computed where the tensors are."""
    if encoding == NEMO:
        return {
            "aux_hidden_states": tensors["aux_hidden_states"],
            "target_probs": tensors["target_probs"],
            "position_mask": tensors["position_mask"].bool(),
            "input_ids": tensors["input_ids"],
            "loss_mask": tensors["loss_mask"],
        }
    if encoding == LOGITS:
        draft_tail = tensors["draft_logits"]
    else:
        if head_rows is None:
            raise EncodingError("encoding 'hidden' needs the lm_head rows of the draft vocabulary")
        draft_tail = F.linear(tensors["final_hidden"], head_rows)
    mask = unpack_bits(tensors["position_bits"], input_ids.numel()).view(*input_ids.shape, 1)
    return assemble(tensors["aux_hidden_states"], draft_tail, mask, input_ids, loss_mask)
