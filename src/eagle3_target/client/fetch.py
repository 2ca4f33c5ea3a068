"""One batch's supervision (or captured features) from one server: over p2p or the wire, checked complete
and bound to its request.

The one place that knows the data path of /generate. A 409 ``no_vocab_mapping``
means the server lost our session (a restart or expiry): the mapping is re-sent,
/model_info is read again (a server that came back as another model is refused)
and the request repeated once, here and nowhere else (/generate is idempotent).
Every reply is read under the limit its batch and encoding allow (limits.py) and
checked before it is returned: keys, dtypes, shapes, finite values, the echo of
the request (binding.py). A failed check is a server fault: the pool fails over.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import torch

from eagle3_target.protocol import binding, capture, contract, encodings, wire
from eagle3_target.protocol.features import WEIGHT_FINAL_NORM, Features

from .agreement import Agreement
from .connection import RequestRejected, ServerConnection, ServerError
from .errors import ServerFault
from .limits import blob_limit
from .p2p import P2PChannel
from .versions import StaleVersion

Answer = tuple[Mapping[str, str], dict[str, torch.Tensor | None]]  # reply headers, tensors


@dataclass(frozen=True)
class Reply:
    """A checked /generate reply: the tensors of ``encoding`` (encodings.decode turns them into supervision)."""

    encoding: str
    tensors: dict[str, torch.Tensor]
    head_rows: torch.Tensor | None = None  # the draft vocabulary's lm_head rows, for "hidden"
    features: Features | None = None  # set: a feature reply (protocol/capture.py's keys), not supervision
    target_version: str | None = None  # of the weights that computed it (None: a server that does not say)


@dataclass(frozen=True)
class _Request:
    """One /generate as sent: its body, what its reply must look like, and how it proves it is ours."""

    body: bytes
    want: encodings.Expected
    limit: int
    request_id: str
    digest: str

    @classmethod
    def of(cls, body: bytes, want: encodings.Expected) -> _Request:
        return cls(body, want, blob_limit(want), uuid.uuid4().hex, binding.digest(body))

    def headers(self, agreement: Agreement, features: Features | None = None) -> dict[str, str]:
        return {**agreement.request_headers(features), contract.REQUEST_ID_HEADER: self.request_id}


async def fetch_supervision(
    conn: ServerConnection,
    agreement: Agreement,
    request: bytes,
    shape: tuple[int, int, int],
    vocab_blob: bytes | None,
) -> Reply:
    """The reply to one /generate of ``request`` (``shape``: batch, seq, draft vocabulary), in the
    agreed encoding, checked before it is returned, so a wrong reply fails over like a dropped one."""
    batch, seq, draft_vocab = shape
    hidden = agreement.info.hidden_size
    want = encodings.expected(agreement.encoding, batch, seq, hidden, draft_vocab, agreement.dtype)
    asked = _Request.of(request, want)
    generate = functools.partial(_generate, conn, agreement, asked)
    reply_headers, tensors = await _remapping(conn, agreement, vocab_blob, generate)
    sent = reply_headers.get(contract.ENCODING_HEADER, encodings.NEMO)
    if sent != agreement.encoding:
        raise wire.WireError(f"{conn.url}: asked for encoding {agreement.encoding!r}, the reply is {sent!r}")
    await _check(agreement, asked, reply_headers, tensors, echoes_inputs=agreement.encoding == encodings.NEMO)
    version = reply_headers.get(contract.TARGET_VERSION_HEADER)
    return Reply(agreement.encoding, {k: tensors[k] for k in want}, target_version=version)


async def fetch_capture(
    conn: ServerConnection,
    agreement: Agreement,
    request: bytes,
    shape: tuple[int, int, int],
    vocab_blob: bytes | None,
    features: Features,
) -> Reply:
    """The reply to one /generate asking ``features`` (over the wire), read under the limit its shape
    and features allow and checked like fetch_supervision's."""
    batch, seq, draft_vocab = shape
    info = agreement.info
    want = capture.expected(
        features, batch, seq, info.hidden_size, info.vocab_size, draft_vocab, agreement.dtype
    )
    asked = _Request.of(request, want)
    headers = asked.headers(agreement, features)

    async def post() -> Answer:
        response, tensors = await conn.post_tensors(
            contract.GENERATE, request, headers=headers, limit=asked.limit
        )
        return response.headers, tensors

    reply_headers, tensors = await _remapping(conn, agreement, vocab_blob, post)
    if reply_headers.get(contract.FEATURES_HEADER) != headers[contract.FEATURES_HEADER]:
        raise wire.WireError(f"{conn.url}: the reply does not carry the features asked for")
    await _check(agreement, asked, reply_headers, tensors, echoes_inputs="input_ids" in want)
    version = reply_headers.get(contract.TARGET_VERSION_HEADER)
    return Reply(agreement.encoding, {k: tensors[k] for k in want}, features=features, target_version=version)


async def _remapping(
    conn: ServerConnection,
    agreement: Agreement,
    vocab_blob: bytes | None,
    generate: Callable[[], Awaitable[Answer]],
) -> Answer:
    """``generate()``; after a 409 no_vocab_mapping (the server lost our session), the mapping again, the
    model checked again, and ``generate()`` once more."""
    try:
        return await generate()
    except ServerError as exc:
        if exc.status != 409 or exc.error != "no_vocab_mapping":
            raise
        if vocab_blob is None:  # the caller never set one: every server would say so
            raise RequestRejected(exc.url, exc.path, exc.status, exc.error, exc.detail) from None
        await conn.set_vocab_mapping(vocab_blob)
        await _same_model(conn, agreement)
        return await generate()


async def _check(
    agreement: Agreement, asked: _Request, headers: Mapping[str, str], tensors: dict, echoes_inputs: bool
) -> None:
    """Every key, dtype and shape; the echo of this request; finite values (off the loop: a pass over the reply)."""
    if agreement.info.request_binding == binding.SCHEME:
        binding.check_echo(headers, asked.request_id, asked.digest)
    encodings.check(tensors, asked.want)
    await asyncio.get_running_loop().run_in_executor(None, _check_values, tensors, asked, echoes_inputs)


def _check_values(tensors: dict[str, torch.Tensor], asked: _Request, echoes_inputs: bool) -> None:
    """Finite values, and where the reply echoes the inputs ("nemo", draft_probs), the request's own."""
    binding.check_finite({k: tensors[k] for k in asked.want})
    if echoes_inputs:
        sent = wire.decode(asked.body)
        binding.check_inputs_echo(tensors, sent["input_ids"], sent["loss_mask"])


async def _same_model(conn: ServerConnection, agreement: Agreement) -> None:
    """After the server lost our session: it must still serve the model we agreed on."""
    info = await conn.model_info()
    diff = agreement.info.difference(info)
    if diff:
        raise ServerFault(f"{conn.url} came back serving another model: {'; '.join(diff)}")


async def fetch_weight(conn: ServerConnection, agreement: Agreement, name: str) -> torch.Tensor:
    """The whole weight ``name`` (features.py WEIGHT_NAMES), checked against the agreed model."""
    info = agreement.info
    shape = (info.hidden_size,) if name == WEIGHT_FINAL_NORM else (info.vocab_size, info.hidden_size)
    return await _fetch_weight(conn, f"{contract.WEIGHTS}/{name}", agreement, shape)


async def fetch_lm_head(
    conn: ServerConnection, agreement: Agreement, draft_vocab: int, version: str | None
) -> torch.Tensor:
    """The lm_head rows of our draft vocabulary [Vd, H] (for the "hidden" encoding), checked, read from the
    weights of ``version`` (the hidden states' own): rows of other weights are StaleVersion."""
    shape = (draft_vocab, agreement.info.hidden_size)
    return await _fetch_weight(conn, contract.LM_HEAD, agreement, shape, version)


async def fetch_input_embeddings(conn: ServerConnection, agreement: Agreement) -> torch.Tensor:
    """The target's input embedding [V, H], checked against the model agreed at join."""
    info = agreement.info
    return await _fetch_weight(
        conn, contract.INPUT_EMBEDDINGS, agreement, (info.vocab_size, info.hidden_size)
    )


async def _fetch_weight(
    conn: ServerConnection,
    path: str,
    agreement: Agreement,
    shape: tuple[int, ...],
    version: str | None = None,
) -> torch.Tensor:
    want = {"weight": (agreement.dtype, shape)}
    headers, tensors = await conn.weight(path, blob_limit(want))
    served = headers.get(contract.TARGET_VERSION_HEADER)
    if version is not None and served != version:
        raise StaleVersion(f"{conn.url}: {path} is of target version {served}, the batch of {version}")
    encodings.check(tensors, want)
    binding.check_finite({"weight": tensors["weight"]})
    return tensors["weight"]


async def _generate(conn: ServerConnection, agreement: Agreement, asked: _Request) -> Answer:
    headers = asked.headers(agreement)
    if agreement.p2p is not None:
        answer = await _over_p2p(conn, agreement.p2p, asked, headers)
        if answer is not None:
            return answer
    response, tensors = await conn.post_tensors(
        contract.GENERATE, asked.body, headers=headers, limit=asked.limit
    )
    return response.headers, tensors


async def _over_p2p(
    conn: ServerConnection, channel: P2PChannel, asked: _Request, headers: dict[str, str]
) -> Answer | None:
    """The reply over the channel's group; None means "use the wire" (no group now, or it failed)."""
    async with channel.lock:
        if not await channel.ready(conn.init_nccl):
            return None
        try:
            response, payload = await conn.post(
                contract.GENERATE,
                asked.body,
                headers={**headers, **channel.request_headers()},
                limit=asked.limit,
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
        tensors = await channel.receive(response.headers, payload, asked.want)
        return None if tensors is None else (response.headers, tensors)
