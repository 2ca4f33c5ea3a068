"""The target service: what each endpoint asks of the model, with no HTTP in it.

It loads and warms the runner, keeps the client sessions and their vocab mappings, and turns a
/generate body into supervision in the asked encoding. Requests name their session by id; failures
are ServiceErrors (errors.py) that the HTTP layer maps to status codes. Model work runs on one
model thread, one /generate at a time, in fair turns by session (scheduler.py); a reply's copy to
host memory runs after its turn, beside the next forward (host_copy.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from eagle3_target.protocol import binding, contract, encodings
from eagle3_target.protocol.contract import PACKING_KEYS
from eagle3_target.protocol.features import CAN_PACKING, LOGITS_DRAFT_PROBS, Features
from eagle3_target.protocol.model_info import ModelInfo
from eagle3_target.protocol.supervision import VocabMapping, build_supervision

from . import features
from .errors import InvalidInput, NotReady, NoVocabMapping, TooLarge
from .host_copy import HostCopier, PendingCopy
from .images import check_images
from .metrics import ServerMetrics
from .options import DEFAULT_PRIORITY, ServerOptions
from .p2p.group import Transfer
from .p2p.groups import P2PGroups
from .request import packing_offered, parse_generate, parse_vocab_mapping
from .runners import HiddenStateRunner, TargetRunner
from .scheduler import FairScheduler, priority_class
from .sessions import PEER_PREFIX, Session, SessionTable

log = logging.getLogger(__name__)

INIT_P2P_MAX_BYTES = 64 << 10  # a small JSON object, parsed on the event loop
WARMUP_TOKENS = 8


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

    def headers(self) -> dict[str, str]:
        """The reply's echo of what it carries: the features asked, else the encoding."""
        if self.features is not None:
            return {contract.FEATURES_HEADER: self.features.to_header()}
        return {contract.ENCODING_HEADER: self.encoding}


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


class TargetService:
    """One server's model, sessions and p2p groups: a method per endpoint, each named by session id."""

    def __init__(self, loader: Callable[[], TargetRunner], options: ServerOptions, metrics: ServerMetrics):
        self.loader, self.options, self.metrics = loader, options, metrics
        self.runner: TargetRunner | None = None
        self.load_error: BaseException | None = None
        self.stopped = asyncio.Event()  # set by --exit-on-disconnect or a failed load
        self.draining = False  # SIGTERM: finish what is in flight, take nothing new
        self.sessions = SessionTable(
            options.session_ttl, max_sessions=options.max_sessions, gauge=metrics.sessions
        )
        self.p2p = P2PGroups(options.p2p, require_auth=options.p2p_requires_auth, registry=metrics.registry)
        self.sessions.on_end(self.p2p.end_session)
        self._model_thread = ThreadPoolExecutor(1, thread_name_prefix="target-model")
        self.turns = FairScheduler(
            options.max_queued_per_session, queued=metrics.queued, wait_seconds=metrics.queue_wait_seconds
        )
        self.copier = HostCopier()

    # -- lifetime ----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Load the model in the background, expire sessions, watch p2p groups; on exit, release it all."""
        tasks = [
            asyncio.create_task(self._load()),
            asyncio.create_task(self._expire_sessions()),
            asyncio.create_task(self.p2p.watch()),
        ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.sessions.end_all()
            await self.p2p.close()
            if self.runner is not None:
                await self._on_model_thread(self.runner.close)
            self._model_thread.shutdown(wait=False)

    async def _load(self) -> None:
        start = time.perf_counter()
        try:
            runner = await self._on_model_thread(self.loader)
            _check_capabilities(runner)
            await self._on_model_thread(_warm_up, runner)
        except Exception as exc:
            log.exception("loading the target model failed")
            self.load_error = exc
            self.stopped.set()
            return
        self.runner = runner
        elapsed = time.perf_counter() - start
        info = runner.info
        self.metrics.loaded(info, elapsed)
        log.info(
            "ready: %s (%s, %d layers, hidden %d, vocab %d, aux layers %s, %s on %s) loaded and warmed in %.1fs",
            info.model,
            info.engine,
            info.num_hidden_layers,
            info.hidden_size,
            info.vocab_size,
            info.aux_layer_ids,
            info.dtype,
            info.device,
            elapsed,
        )

    async def _expire_sessions(self) -> None:
        ttl = self.options.session_ttl
        period = max(1.0, min(60.0, ttl / 4)) if ttl > 0 else 60.0
        while True:
            await asyncio.sleep(period)
            for sid in self.sessions.expire():
                log.info("session %s expired after %.0fs idle", sid, ttl)

    async def _on_model_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._model_thread, fn, *args)

    # -- state -------------------------------------------------------------------------------

    def status(self) -> str:
        """ "ok", "loading" or "draining": what /health reports."""
        if self.draining:
            return "draining"
        return "loading" if self.runner is None else "ok"

    def ready_runner(self) -> TargetRunner:
        if self.draining:
            raise NotReady("draining", "this server is shutting down; use another")
        if self.runner is None:
            raise NotReady("not_ready", "the target model is still loading")
        return self.runner

    def heartbeat(self, session_id: str) -> None:
        self.sessions.touch(session_id)
        self.metrics.heartbeat_timestamp.set(time.time())

    def disconnect(self, session_id: str) -> None:
        if self.sessions.end(session_id):
            log.info("session %s disconnected", session_id)
        if self.options.exit_on_disconnect:
            log.info("--exit-on-disconnect: stopping after this response")
            asyncio.get_running_loop().call_soon(self.stopped.set)

    # -- what a client asks before training ----------------------------------------------------

    def model_info(self, session_id: str) -> ModelInfo:
        runner = self.ready_runner()
        self.sessions.touch(session_id)
        return runner.info.model_info(
            nccl_port=self.options.p2p.port,
            p2p=self.p2p.info(runner.info.device),
            request_binding=binding.SCHEME,
        )

    async def input_embeddings(self, session_id: str) -> torch.Tensor:
        runner = self.ready_runner()
        self.sessions.touch(session_id)
        # Not cached: on a GPU the host copy is ~1 GB for an 8B model, and each trainer asks once.
        # On the CPU .cpu() is a view, so the blob streams straight from the model's own weight.
        return await self._on_model_thread(lambda: runner.input_embeddings().detach().cpu())

    async def set_vocab_mapping(self, session_id: str, body: bytearray) -> None:
        runner = self.ready_runner()
        session = self.sessions.touch(session_id)
        # Off the event loop: validating a 64 MiB body must not stall /livez and /health.
        vocab = await asyncio.to_thread(parse_vocab_mapping, body, runner.info.vocab_size, runner.info.device)
        if (
            session.id.startswith(PEER_PREFIX)
            and session.vocab is not None
            and not _same(session.vocab, vocab)
        ):
            # Header-less (NeMo) trainers on one node share this session: the last mapping wins for all.
            log.warning(
                "session %s: a different vocab mapping replaces the current one; trainers sharing an "
                "address should each send %s",
                session.id,
                contract.SESSION_HEADER,
            )
            self.metrics.peer_mapping_conflicts.inc()
        session.vocab = vocab  # a forward already running keeps the mapping it was handed

    async def lm_head_rows(self, session_id: str) -> torch.Tensor:
        """Our extension: the lm_head rows of the session's draft vocabulary, for the "hidden" encoding."""
        runner = self.ready_runner()
        session = self.sessions.touch(session_id)
        _offered(runner, encodings.HIDDEN)
        ids = _vocab(session).selected_token_ids
        return await self._on_model_thread(lambda: runner.lm_head_rows(ids).cpu())

    async def weight(self, session_id: str, name: str) -> torch.Tensor:
        """Our extension: a whole weight a trainer fetches once (features.py WEIGHT_NAMES), in host memory."""
        runner = self.ready_runner()
        self.sessions.touch(session_id)
        if name not in runner.info.weights:
            offered = ", ".join(runner.info.weights) or "none"
            raise InvalidInput(
                "weight_not_offered", f"no weight {name[:64]!r} here; this server offers {offered}"
            )
        return await self._on_model_thread(lambda: runner.weight(name).detach().cpu())

    async def init_p2p(self, session_id: str, address: str, body: bytes) -> dict:
        """/init_nccl: reserve a port on ``address`` (where the request arrived) for the session's group."""
        runner = self.ready_runner()
        session = self.sessions.touch(session_id)
        if len(body) > INIT_P2P_MAX_BYTES:
            raise TooLarge("request_entity_too_large", f"/init_nccl takes at most {INIT_P2P_MAX_BYTES} bytes")
        return await self.p2p.init(session, address, body, runner.info.device)

    # -- /generate ----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def generate(self, request: GenerateRequest) -> AsyncIterator[Answer]:
        """Validate, run the forward and the projection, and yield the Answer to deliver.

        An answer over p2p keeps the session's transfer lock until it is delivered, so transfers
        follow request order; one over the wire holds nothing.
        """
        runner = self.ready_runner()
        session = self.sessions.touch(request.session_id)
        priority = priority_class(request.priority, self.options.max_priority)
        start = time.perf_counter()
        inputs = await asyncio.to_thread(
            parse_generate, request.body, runner.info.vocab_size, self.options.max_batch_tokens
        )
        asked = features.requested(runner.info, request.features, request.encoding, request.p2p)
        encoding = _offered(runner, request.encoding)
        check_images(inputs, runner.info, asked is not None, self.options.max_image_tokens)
        packing_offered(inputs, CAN_PACKING in runner.info.features, runner.info.engine)
        vocab = _vocab(session) if asked is None or asked.logits == LOGITS_DRAFT_PROBS else None
        job = _Job(runner, inputs, vocab, encoding, session.id, priority, features=asked)
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
            supervision = await self._on_model_thread(work, job, copier)
            if isinstance(supervision, PendingCopy) and not self.options.overlap_host_copy:
                supervision = await _arrived(supervision, job.timings)
        if isinstance(supervision, PendingCopy):  # the next request's forward runs meanwhile
            supervision = await _arrived(supervision, job.timings)
        return Answer(supervision, job.encoding, tokens, job.timings, transfer, job.features)

    def delivered(self, answer: Answer, path: str, nbytes: int) -> None:
        """Count a delivered answer: its phases, its tokens, its bytes by path (wire or p2p)."""
        for phase, seconds in answer.timings.items():
            self.metrics.generate_phase_seconds.labels(phase).observe(seconds)
        self.metrics.tokens.inc(answer.tokens)
        self.metrics.sent_bytes.labels(path).inc(nbytes)


def _check_capabilities(runner: TargetRunner) -> None:
    if encodings.HIDDEN in runner.info.encodings and not isinstance(runner, HiddenStateRunner):
        raise TypeError(f"{type(runner).__name__} offers the hidden encoding but is no HiddenStateRunner")


def _offered(runner: TargetRunner, encoding: str) -> str:
    if encoding not in runner.info.encodings:
        raise InvalidInput(
            "encoding_not_offered",
            f"encoding {encoding!r} is not offered; this server offers {', '.join(runner.info.encodings)}",
        )
    return encoding


def _same(a: VocabMapping, b: VocabMapping) -> bool:
    return torch.equal(a.selected_token_ids, b.selected_token_ids) and torch.equal(
        a.selected_token_mask, b.selected_token_mask
    )


def _vocab(session: Session) -> VocabMapping:
    if session.vocab is None:
        raise NoVocabMapping()
    return session.vocab


def _warm_up(runner: TargetRunner) -> None:
    """One tiny forward and projection, so the first real request pays no lazy initialisation."""
    device = runner.info.device
    ids = torch.zeros(1, WARMUP_TOKENS, dtype=torch.long, device=device)
    logits, aux = runner.forward(ids, torch.ones_like(ids))
    build_supervision(logits, aux, ids, ids, VocabMapping.identity(logits.shape[-1], device))


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
