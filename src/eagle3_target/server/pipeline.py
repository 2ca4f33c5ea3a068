"""/generate from a validated body to supervision in the asked encoding, or to a feature request's capture.

Model work runs on the model thread (model_host.py), one request at a time, in fair turns by session
(scheduler.py); a reply's projection and copy to host memory run after its turn, beside the next forward
(host_copy.py). No HTTP here (the service's contract in pyproject.toml).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import torch

from eagle3_target.protocol import contract, encodings
from eagle3_target.protocol.contract import PACKING_KEYS
from eagle3_target.protocol.features import CAN_PACKING, LOGITS_DRAFT_PROBS, Features
from eagle3_target.protocol.supervision import VocabMapping

from . import features
from .host_copy import HostCopier, PendingCopy
from .images import check_images
from .metrics import ServerMetrics
from .model_host import ModelHost, offered
from .options import DEFAULT_PRIORITY, ServerOptions
from .p2p.group import Transfer
from .p2p.groups import P2PGroups
from .request import packing_offered, parse_generate
from .runners import HiddenStateRunner, TargetRunner
from .scheduler import FairScheduler, priority_class
from .sessions import SessionTable


@dataclass(frozen=True)
class GenerateRequest:
    """One /generate as the service sees it."""

    session_id: str
    body: bytearray  # the wire blob of input_ids, attention_mask, loss_mask
    encoding: str = encodings.NEMO
    p2p: bool = False  # the client asks for the tensors over its session's p2p group
    sequence: str | None = None  # our client's p2p transfer number; NeMo's sends none
    features: str | None = None  # X-Eagle3-Features (protocol/features.py); NeMo's clients send none
    priority: str | None = None  # the X-Eagle3-Priority class asked for; None: normal


@dataclass
class Answer:
    """Supervision for one /generate, computed and ready to deliver."""

    supervision: dict[str, torch.Tensor]  # in host memory for the wire, on the device for p2p
    encoding: str
    tokens: int  # B x S of the request
    timings: dict[str, float]  # seconds per phase, for Server-Timing and the phase histogram
    transfer: Transfer | None  # set: deliver over p2p after the metadata; None: over the wire
    features: Features | None = None
    version: str | None = None  # of the weights the forward ran on

    def headers(self) -> dict[str, str]:
        """The reply's echo of what it carries (the features requested, else the encoding) and the version
        of the weights that computed it."""
        version = {contract.TARGET_VERSION_HEADER: self.version} if self.version else {}
        if self.features is not None:
            return {contract.FEATURES_HEADER: self.features.to_header(), **version}
        return {contract.ENCODING_HEADER: self.encoding, **version}


@dataclass
class _Job:
    """A validated /generate for the model thread."""

    runner: TargetRunner
    inputs: dict[str, torch.Tensor]  # input_ids, attention_mask, loss_mask
    vocab: VocabMapping | None  # the session's, taken once; None for features that need none
    encoding: str
    session: str = ""  # whose turn it is at the model (scheduler.py)
    priority: str = DEFAULT_PRIORITY
    timings: dict[str, float] = field(default_factory=dict)
    features: Features | None = None  # a feature request instead of an encoding
    version: str | None = None  # of the weights the forward runs on, read on the model thread


class GeneratePipeline:
    """/generate: validate, wait for the session's turn, run the forward or capture, project, deliver."""

    def __init__(
        self,
        model: ModelHost,
        sessions: SessionTable,
        p2p: P2PGroups,
        options: ServerOptions,
        metrics: ServerMetrics,
    ):
        self.model, self.sessions, self.p2p = model, sessions, p2p
        self.options, self.metrics = options, metrics
        self.turns = FairScheduler(
            options.max_queued_per_session, queued=metrics.queued, wait_seconds=metrics.queue_wait_seconds
        )
        self.copier = HostCopier()

    @contextlib.asynccontextmanager
    async def generate(self, request: GenerateRequest) -> AsyncIterator[Answer]:
        """Validate, run the forward and the projection, and yield the Answer to deliver.

        An answer over p2p keeps the session's transfer lock until it is delivered, so transfers
        follow request order; one over the wire holds nothing.
        """
        runner = self.model.ready()
        session = self.sessions.touch(request.session_id)
        priority = priority_class(request.priority, self.options.max_priority)
        start = time.perf_counter()
        inputs = await asyncio.to_thread(
            parse_generate, request.body, runner.info.vocab_size, self.options.max_batch_tokens
        )
        wanted = features.requested(runner.info, request.features, request.encoding, request.p2p)
        encoding = offered(runner, request.encoding)
        check_images(inputs, runner.info, wanted is not None, self.options.max_image_tokens)
        packing_offered(inputs, CAN_PACKING in runner.info.features, runner.info.engine)
        vocab = session.mapping() if wanted is None or wanted.logits == LOGITS_DRAFT_PROBS else None
        job = _Job(runner, inputs, vocab, encoding, session.id, priority, features=wanted)
        job.timings["decode"] = time.perf_counter() - start
        async with self.p2p.transfer(session, request.p2p, request.sequence) as transfer:
            if transfer is not None:
                yield await self._run(job, transfer)
                return
        yield await self._run(job, None)

    async def _run(self, job: _Job, transfer: Transfer | None) -> Answer:
        tokens = job.inputs["input_ids"].numel()
        copier = self.copier if transfer is None else None  # the p2p path sends from the device
        work = _supervise if job.features is None else _capture
        async with self.turns.turn(job.session, tokens, job.priority):
            supervision = await self.model.call(self._versioned, work, job, copier)
            if isinstance(supervision, PendingCopy) and not self.options.overlap_host_copy:
                supervision = await _arrived(supervision, job.timings)
        if isinstance(supervision, PendingCopy):  # the next request's forward runs meanwhile
            supervision = await _arrived(supervision, job.timings)
        return Answer(supervision, job.encoding, tokens, job.timings, transfer, job.features, job.version)

    def _versioned(self, work, job: _Job, copier: HostCopier | None):
        """On the model thread: ``work`` and the version of the weights it runs on (a refresh swaps both
        between two such calls, never during one)."""
        job.version = self.model.version
        return work(job, copier)

    def delivered(self, answer: Answer, path: str, nbytes: int) -> None:
        """Count a delivered answer: its phases, its tokens, its bytes by path (wire or p2p)."""
        for phase, seconds in answer.timings.items():
            self.metrics.generate_phase_seconds.labels(phase).observe(seconds)
        self.metrics.tokens.inc(answer.tokens)
        self.metrics.sent_bytes.labels(path).inc(nbytes)


def _supervise(job: _Job, copier: HostCopier | None) -> dict[str, torch.Tensor] | PendingCopy:
    """On the model thread: the forward. For the wire the projection into the encoding runs after the turn,
    beside the next forward, then the copy to host memory (host_copy.py); p2p sends from the device."""
    runner, inputs = job.runner, job.inputs
    device = runner.info.device
    start = time.perf_counter()
    input_ids = inputs["input_ids"].to(device)
    attention_mask = inputs["attention_mask"].to(device)
    packed = {k: inputs[k].to(device) for k in PACKING_KEYS if k in inputs}  # offered: packing_offered
    hidden = None
    if job.encoding == encodings.HIDDEN and isinstance(runner, HiddenStateRunner):
        logits, aux, hidden = runner.forward_hidden(input_ids, attention_mask, **packed)
    else:
        logits, aux = runner.forward(input_ids, attention_mask, **packed)
    loss_mask = inputs["loss_mask"].to(device)  # queued on the compute stream, before the projection
    if torch.device(device).type == "cuda":  # CUDA runs ahead of the host: the forward's time is its own
        torch.cuda.synchronize(device)  # every stream: an engine may compute on its own
    job.timings["forward"] = time.perf_counter() - start

    def project() -> dict[str, torch.Tensor]:
        start = time.perf_counter()
        reply = encodings.encode(job.encoding, logits, aux, input_ids, loss_mask, job.vocab, hidden)
        if torch.device(device).type == "cuda":  # on its stream (the side one after the turn): its own time
            torch.cuda.current_stream(device).synchronize()
        job.timings["projection"] = time.perf_counter() - start
        return reply

    if copier is not None:
        return copier.start(project, device)
    return {k: v.contiguous() for k, v in project().items()}


def _capture(job: _Job, copier: HostCopier | None) -> dict[str, torch.Tensor] | PendingCopy:
    """On the model thread: the feature request's capture; its reply's assembly and copy to host memory
    run after the turn (feature replies go over the wire only)."""
    assemble = features.capture(job.runner, job.inputs, job.features, job.vocab, job.timings)
    return copier.start(assemble, job.runner.info.device) if copier else assemble()


async def _arrived(pending: PendingCopy, timings: dict[str, float]) -> dict[str, torch.Tensor]:
    """The reply in host memory, once its projection and copy are done: waited for off the event loop.
    "copy" is the wait after the projection ended (the projection has its own phase)."""
    start = time.perf_counter()
    host = pending.wait() if pending.done else await asyncio.to_thread(pending.wait)
    timings["copy"] = time.perf_counter() - max(start, pending.projected_at or start)
    return host
