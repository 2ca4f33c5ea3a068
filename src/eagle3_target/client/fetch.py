"""One batch's supervision from one server: over p2p or the wire, checked complete.

The one place that knows the data path of /generate. A 409 ``no_vocab_mapping``
means the server lost our session (a restart or expiry): the mapping is re-sent
and the request repeated once, here and nowhere else (/generate is idempotent).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import torch

from eagle3_target.protocol import capture, contract, encodings, wire
from eagle3_target.protocol.features import WEIGHT_FINAL_NORM, Features

from .agreement import Agreement
from .connection import ServerConnection, ServerError
from .p2p import P2PChannel

Answer = tuple[Mapping[str, str], dict[str, torch.Tensor | None]]  # reply headers, tensors


@dataclass(frozen=True)
class Reply:
    """A checked /generate reply: the tensors of ``encoding`` (encodings.decode turns them into supervision)."""

    encoding: str
    tensors: dict[str, torch.Tensor]
    head_rows: torch.Tensor | None = None  # the draft vocabulary's lm_head rows, for "hidden"
    features: Features | None = None  # set: a feature reply (protocol/capture.py's keys), not supervision


async def fetch_supervision(
    conn: ServerConnection,
    agreement: Agreement,
    request: bytes,
    shape: tuple[int, int, int],
    vocab_blob: bytes | None,
) -> Reply:
    """The reply to one /generate of ``request`` (``shape``: batch, seq, draft vocabulary), in the
    agreed encoding, checked for every key, dtype and shape before it is returned, so an incomplete
    reply fails over like a dropped connection."""
    reply_headers, tensors = await _remapping(conn, vocab_blob, lambda: _generate(conn, agreement, request))
    sent = reply_headers.get(contract.ENCODING_HEADER, encodings.NEMO)
    if sent != agreement.encoding:
        raise wire.WireError(f"{conn.url}: asked for encoding {agreement.encoding!r}, the reply is {sent!r}")
    batch, seq, draft_vocab = shape
    hidden = agreement.info.hidden_size
    want = encodings.expected(agreement.encoding, batch, seq, hidden, draft_vocab, agreement.dtype)
    encodings.check(tensors, want)
    return Reply(agreement.encoding, {k: tensors[k] for k in want})


async def fetch_capture(
    conn: ServerConnection,
    agreement: Agreement,
    request: bytes,
    shape: tuple[int, int, int],
    vocab_blob: bytes | None,
    features: Features,
) -> Reply:
    """The reply to one /generate asking ``features`` (over the wire), checked like fetch_supervision's."""
    headers = agreement.request_headers(features)

    async def post() -> Answer:
        response, tensors = await conn.post_tensors(contract.GENERATE, request, headers=headers)
        return response.headers, tensors

    reply_headers, tensors = await _remapping(conn, vocab_blob, post)
    if reply_headers.get(contract.FEATURES_HEADER) != headers[contract.FEATURES_HEADER]:
        raise wire.WireError(f"{conn.url}: the reply does not carry the features asked for")
    batch, seq, draft_vocab = shape
    info = agreement.info
    want = capture.expected(
        features, batch, seq, info.hidden_size, info.vocab_size, draft_vocab, agreement.dtype
    )
    encodings.check(tensors, want)
    return Reply(agreement.encoding, {k: tensors[k] for k in want}, features=features)


async def _remapping(
    conn: ServerConnection, vocab_blob: bytes | None, generate: Callable[[], Awaitable[Answer]]
) -> Answer:
    """``generate()``; after a 409 no_vocab_mapping (the server lost our session), the mapping
    again and ``generate()`` once more."""
    try:
        return await generate()
    except ServerError as exc:
        if exc.status != 409 or exc.error != "no_vocab_mapping" or vocab_blob is None:
            raise
        await conn.set_vocab_mapping(vocab_blob)
        return await generate()


async def fetch_weight(conn: ServerConnection, agreement: Agreement, name: str) -> torch.Tensor:
    """The whole weight ``name`` (features.py WEIGHT_NAMES), checked against the agreed model."""
    info = agreement.info
    shapes = {WEIGHT_FINAL_NORM: (info.hidden_size,)}
    shape = shapes.get(name, (info.vocab_size, info.hidden_size))
    tensors = await conn.weight(name)
    encodings.check(tensors, {"weight": (agreement.dtype, shape)})
    return tensors["weight"]


async def fetch_lm_head(conn: ServerConnection, agreement: Agreement, draft_vocab: int) -> torch.Tensor:
    """The lm_head rows of our draft vocabulary [Vd, H] (for the "hidden" encoding), checked."""
    tensors = await conn.lm_head()
    encodings.check(tensors, {"weight": (agreement.dtype, (draft_vocab, agreement.info.hidden_size))})
    return tensors["weight"]


async def _generate(conn: ServerConnection, agreement: Agreement, request: bytes) -> Answer:
    headers = agreement.request_headers()
    if agreement.p2p is not None:
        answer = await _over_p2p(conn, agreement.p2p, request, headers)
        if answer is not None:
            return answer
    response, tensors = await conn.post_tensors(contract.GENERATE, request, headers=headers)
    return response.headers, tensors


async def _over_p2p(
    conn: ServerConnection, channel: P2PChannel, request: bytes, headers: dict[str, str]
) -> Answer | None:
    """The reply over the channel's group; None means "use the wire" (no group now, or it failed)."""
    async with channel.lock:
        if not await channel.ready(conn.init_nccl):
            return None
        try:
            response, payload = await conn.post(
                contract.GENERATE, request, headers={**headers, **channel.request_headers()}
            )
        except ServerError as exc:
            channel.reset(f"/generate answered {exc.status}")  # our session (and its group) may be gone
            raise
        except Exception:
            channel.reset("the /generate request failed")  # we cannot know whether the server started sending
            raise
        if response.headers.get(contract.NCCL_HEADER) != "1":
            channel.reset("the server answered over the wire")
            return response.headers, wire.decode(payload)
        tensors = await channel.receive(response.headers, payload)
        return None if tensors is None else (response.headers, tensors)
