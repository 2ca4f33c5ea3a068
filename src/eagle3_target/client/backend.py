"""The trainer's view: NeMo's Eagle3TargetBackend surface over a pool of remote target servers.

All network work runs on one background event-loop thread; every public method
here is synchronous (or returns a future-like handle), so a plain training loop
never sees asyncio.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from eagle3_target.protocol import wire
from eagle3_target.protocol.contract import GENERATE_INPUT_KEYS
from eagle3_target.protocol.features import WEIGHT_NAMES, Features
from eagle3_target.protocol.model_info import check_version_choice

from .capture import CaptureHandle, decoded, request_body
from .dispatch import TargetPool
from .endpoints import EndpointResolver, default_spec, make_resolver, parse_specs, read_auth_token
from .fetch import Reply
from .handles import FreshReply, PendingHandle
from .inputs import BatchInputs, nemo_inputs
from .loop_thread import LoopThread
from .options import PoolOptions


@dataclass
class TargetBatch:
    """One batch of EAGLE-3 supervision on the trainer's device."""

    aux_hidden_states: torch.Tensor  # [B, S, 3H], target dtype
    input_ids: torch.Tensor  # [B, S] int64, shifted left by one
    attention_mask: torch.Tensor  # [B, S], the caller's own
    loss_mask: torch.Tensor  # [B, S] int64, shifted left by one
    target_probs: torch.Tensor  # [B, S, Vd] float32
    position_mask: torch.Tensor  # [B, S, 1] bool
    # NeMo's packing metadata, the caller's own (unshifted), for its trainer; None for unpacked rows
    position_ids: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    doc_remaining: torch.Tensor | None = None
    target_version: str | None = None  # of the weights that computed it (None: a server that does not say)

    def as_dict(self) -> dict[str, torch.Tensor]:
        """The tensors this batch holds (packing metadata only when packed)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: value for name, value in values.items() if isinstance(value, torch.Tensor)}


class BatchHandle(PendingHandle):
    """A pending batch: ``result()`` blocks until the supervision is on the caller's device."""

    def __init__(
        self,
        future: concurrent.futures.Future | FreshReply,
        inputs: dict[str, torch.Tensor],
        device: torch.device,
        on_device: _DeviceCache,
        packing: dict[str, torch.Tensor] | None = None,
    ):
        super().__init__(future)
        self._inputs = inputs
        self._device = device
        self._on_device = on_device
        self._packing = packing or {}

    def result(self, timeout: float | None = None) -> TargetBatch:
        """Decode the (already checked) reply on the caller's device: for "logits" the same ops, in the
        same dtype, as the server runs for "nemo", so the batch is bit-identical on the same device."""
        reply: Reply = self._pending.result(timeout)
        ids, loss = self._inputs["input_ids"], self._inputs["loss_mask"]
        supervision = decoded(reply, ids, loss, self._device, self._on_device)
        attention_mask = self._inputs["attention_mask"].to(self._device)
        return TargetBatch(
            attention_mask=attention_mask, **supervision, **self._packing, target_version=reply.target_version
        )


class _DeviceCache:
    """The device copy of the last host tensor asked for: the lm_head rows cross once per mapping."""

    def __init__(self):
        self._lock = threading.Lock()
        self._last: tuple[torch.Tensor, torch.device, torch.Tensor] | None = None

    def __call__(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        with self._lock:
            if self._last is None or self._last[0] is not tensor or self._last[1] != device:
                self._last = (tensor, device, tensor.to(device))
            return self._last[2]


class RemoteTargetBackend:
    """Supervision from remote target servers, with discovery, prefetch, retries and failover.

    ``endpoints``: a spec (see endpoints.py) or a list of them; default: $EAGLE3_TARGET_SERVICE.
    ``auth_token``: default: the file named by $EAGLE3_TARGET_AUTH_TOKEN_FILE.
    ``nameserver``: "host[:port]" of the DNS server to ask; default: the system's.
    ``device``: where batches land; default: the device of each call's input_ids.
    ``encoding``: "auto", "nemo", "logits" or "hidden" (see protocol/encodings.py); default:
    ``options.encoding``, itself "auto". A server that does not offer it is refused (EncodingError).
    ``features``: a feature request (protocol/features.py) for ``capture``; default ``options.features``.
    A server that cannot serve it is refused (FeatureError). ``generate_batch`` works alongside.

    The constructor returns once one server is ready. It waits at most ``options.start_timeout``
    (300 s), warning which servers it cannot reach and why after ``options.wait_log_interval`` (5 s), then
    backing off to every ``options.wait_log_max`` (60 s), then raises EndpointError (no name resolved) or BatchFailedError (no server became ready).
    """

    def __init__(
        self,
        endpoints: str | list[str] | None = None,
        *,
        auth_token: str | None = None,
        nameserver: str | None = None,
        device: torch.device | str | None = None,
        options: PoolOptions | None = None,
        encoding: str | None = None,
        features: Features | None = None,
    ):
        options = _options(options, encoding, features)
        if endpoints is None:
            endpoints = default_spec()
        text = endpoints if isinstance(endpoints, str) else ",".join(endpoints)
        resolver = EndpointResolver(parse_specs(text), make_resolver(nameserver), options.max_endpoints)
        self.session_id = str(uuid.uuid4())  # one per backend: the servers keep our vocab mapping under it
        self.device = torch.device(device) if device is not None else None
        self._embeddings: torch.nn.Embedding | None = None
        self._draft_vocab = 0  # set by set_vocab_mapping; until then servers refuse /generate (409)
        self._head_rows = _DeviceCache()
        self._weights: dict[str, torch.Tensor] = {}
        self._loop = LoopThread()
        try:
            # asyncio primitives bind to the loop that first uses them: ours, once start() runs there.
            self.pool = TargetPool(
                resolver, self.session_id, auth_token=auth_token or read_auth_token(), options=options
            )
            self._loop.call(self.pool.start())
        except BaseException:
            self.close()
            raise

    # -- NeMo's backend surface ------------------------------------------------------------

    def model_info(self) -> dict[str, Any]:
        """/model_info of the fleet as NeMo's backend returns it: a JSON object."""
        return {} if self.pool.reference is None else self.pool.reference.to_json()

    @property
    def encodings(self) -> dict[str, str]:
        """The supervision encoding each healthy server sends us, by URL (negotiated when it joined)."""
        return {m.url: m.agreement.encoding for m in self.pool.healthy()}

    @property
    def healthy_servers(self) -> int:
        return len(self.pool.healthy())

    def wait_for_servers(self, timeout: float = 60.0) -> int:
        """Wait until every server found so far has joined or failed to (at most ``timeout`` seconds);
        return the number of healthy servers. The constructor returns once the first one is ready."""
        return self._loop.call(self.pool.settle(timeout))

    def set_vocab_mapping(self, selected_token_ids: torch.Tensor, selected_token_mask: torch.Tensor) -> None:
        """Send the draft vocabulary to every server now and to every server that joins later."""
        blob = wire.encode(
            {
                "selected_token_ids": selected_token_ids.detach().to("cpu", torch.int64),
                "selected_token_mask": selected_token_mask.detach().to("cpu", torch.bool),
            }
        )
        self._loop.call(self.pool.set_vocab_mapping(blob))
        self._draft_vocab = int(selected_token_ids.numel())

    def get_input_embeddings(self) -> torch.nn.Embedding:
        """The target's frozen input embedding (fetched once, then cached)."""
        if self._embeddings is None:
            weight = self._loop.call(self.pool.input_embeddings())
            device = self.device or torch.device("cpu")
            embedding = torch.nn.Embedding.from_pretrained(weight.to(device), freeze=True)
            self._embeddings = embedding
        return self._embeddings

    def generate_batch_async(self, *args, **kwargs) -> BatchHandle:
        """Submit one batch, with NeMo's ``generate_batch`` arguments (inputs.nemo_inputs); the handle's
        ``result()`` returns its TargetBatch.

        Packed rows (NeMo's ``packed_sequence_size``) add ``position_ids`` and ``seq_lens``, which the
        servers compute under, and ``doc_remaining``, which only comes back in the batch for the trainer."""
        nemo = nemo_inputs(*args, **kwargs)
        if nemo.media:
            raise TypeError(
                f"generate_batch takes no {', '.join(sorted(nemo.media))}: images go with capture"
            )
        input_ids = nemo.input_ids
        given = dict(zip(GENERATE_INPUT_KEYS, (input_ids, nemo.attention_mask, nemo.loss_mask), strict=True))
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be a [B, S] matrix, got shape {list(input_ids.shape)}")
        packing = _packing(nemo.position_ids, nemo.seq_lens, nemo.doc_remaining, self.pool.options.packing)
        if packing:
            given.update(nemo.packing)
        inputs = {k: t.detach().to("cpu", torch.int64) for k, t in given.items()}
        batch, seq = inputs["input_ids"].shape
        body = wire.encode(inputs)
        reply = self._fresh(lambda: self.pool.generate(body, batch, seq, self._draft_vocab))
        inputs["attention_mask"] = nemo.attention_mask  # the caller's own, as NeMo returns it
        device = self.device or input_ids.device
        return BatchHandle(reply, inputs, device, self._head_rows, packing)

    def generate_batch(self, *args, **kwargs) -> TargetBatch:
        """``generate_batch_async(...).result()``: NeMo's RemoteEagle3TargetModel call."""
        return self.generate_batch_async(*args, **kwargs).result()

    # -- feature requests (our extension) ---------------------------------------------------

    @property
    def features(self) -> Features | None:
        return self.pool.options.features

    def capture_async(self, inputs: BatchInputs) -> CaptureHandle:
        """Submit one batch for the backend's ``features``; the handle's ``result()`` is the reply's
        tensors by key (``Features.reply_keys``) on the caller's device. The batch's ``position_ids`` and
        ``seq_lens`` are NeMo's packing metadata, for servers that offer "packing"; its ``media`` an
        image-text batch's processor outputs (contract.IMAGE_KEYS), for servers that take images."""
        features = self.features
        if features is None:
            raise ValueError("this backend asks for no features: pass features=Features(...) to it")
        body = request_body(self.pool.reference, inputs)
        batch, seq = inputs.input_ids.shape
        blob = wire.encode(body)
        reply = self._fresh(lambda: self.pool.capture(blob, batch, seq, self._draft_vocab))
        device = self.device or inputs.input_ids.device
        return CaptureHandle(reply, device, body, self._head_rows)

    def capture(self, inputs: BatchInputs) -> dict[str, torch.Tensor]:
        """``capture_async(inputs).result()``."""
        return self.capture_async(inputs).result()

    def prefetch_captures(
        self, batches: Iterable[BatchInputs], depth: int | None = None
    ) -> Iterator[dict[str, torch.Tensor]]:
        """``prefetch`` for ``capture``: each item is one batch's BatchInputs."""
        return _in_order((self.capture_async(b) for b in batches), lambda: self._depth(depth))

    # -- target versions (our extension; versions.py) ---------------------------------------

    @property
    def target_version(self) -> str | None:
        """The target version batches come from now: the pinned label, or the newest the fleet serves (None
        where the servers report none)."""
        return self.pool.membership.wanted_version()

    def pin_target_version(self, version: str) -> None:
        """Train on ``version`` (a label, or ``newest``) from the next batch taken on: batches prefetched from
        another version are asked again, and only servers at it are sent requests."""
        check_version_choice(version)
        self._loop.call(self.pool.pin_version(version))

    def _fresh(self, call: Callable[[], Any]) -> FreshReply:
        return FreshReply(lambda: self._loop.submit(call()), self.pool.membership.is_wanted)

    def target_weight(self, name: str) -> torch.Tensor:
        """The target's whole weight ``name`` ("input_embeddings", "lm_head", "final_norm"), fetched
        once from the fleet, checked against the agreed shape and cached, on the backend's device."""
        if name not in WEIGHT_NAMES:
            raise ValueError(f"unknown weight {name!r}; choose {', '.join(WEIGHT_NAMES)}")
        if name not in self._weights:
            weight = self._loop.call(self.pool.weight(name))
            self._weights[name] = weight.to(self.device or torch.device("cpu"))
        return self._weights[name]

    def prefetch(
        self, batches: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], depth: int | None = None
    ) -> Iterator[TargetBatch]:
        """Yield the supervision of (input_ids, attention_mask, loss_mask) triples in submission order,
        keeping up to ``depth`` (default and cap: the healthy servers' capacity) requests in flight."""
        return _in_order((self.generate_batch_async(*b) for b in batches), lambda: self._depth(depth))

    def _depth(self, requested: int | None) -> int:
        capacity = max(1, len(self.pool.healthy()) * self.pool.options.max_in_flight)
        return capacity if requested is None else max(1, min(requested, capacity))

    def close(self) -> None:
        """Cancel what is still pending, end our sessions on the servers, stop the loop thread."""
        self._loop.close(self.pool.close if hasattr(self, "pool") else None)

    def __enter__(self) -> RemoteTargetBackend:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _options(options: PoolOptions | None, encoding: str | None, features: Features | None) -> PoolOptions:
    """The pool's options with the constructor's shortcuts applied (PoolOptions validates them)."""
    options = options or PoolOptions()
    if encoding is not None:
        options = replace(options, encoding=encoding)
    if features is not None:
        options = replace(options, features=features)
    return options


def _packing(position_ids, seq_lens, doc_remaining, allowed: bool) -> dict[str, torch.Tensor]:
    """The packing metadata handed back in the batch; {} for unpacked rows."""
    if position_ids is None and seq_lens is None:
        return {}
    if position_ids is None or seq_lens is None:
        raise ValueError("packed rows need both position_ids and seq_lens")
    if not allowed:
        raise ValueError(
            "packed rows need PoolOptions(packing=True): servers without packing are then refused"
        )
    packing = {"position_ids": position_ids, "seq_lens": seq_lens}
    return packing if doc_remaining is None else {**packing, "doc_remaining": doc_remaining}


def _in_order(handles: Iterator, depth: Callable[[], int]) -> Iterator:
    """The handles' results in submission order, keeping up to ``depth()`` of them in flight."""
    waiting: collections.deque = collections.deque()
    for handle in handles:
        waiting.append(handle)
        while len(waiting) > depth():
            yield waiting.popleft().result()
    while waiting:
        yield waiting.popleft().result()
