"""POST /weights/broadcast and /weights/broadcast/outcome: new target weights sent live by a trainer over an
authenticated p2p group, in the manner of SGLang's and vLLM's update_weights_from_distributed. No HTTP here.

The announcement (every tensor's name, dtype and shape, and the version label) is checked against the served
weights before any tensor moves. Only then is a port of the p2p range reserved, with the authenticated
rendezvous a session's /init_nccl gets (p2p/groups.py), and the reply tells the trainer where to join and the
group's secret. The trainer joins, proves the secret and sends every tensor in the announced order; they are
received into host memory, checked for NaN, and swapped in with the version in one call on the model thread
(refresh.py). A sender that never joins, dies or stalls ends the transfer within --p2p-rendezvous-timeout or
--p2p-timeout: refused, the received tensors freed, the old weights serving under their version. The outcome
is what /weights/broadcast/outcome answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from eagle3_target.protocol.model_info import check_target_version
from eagle3_target.protocol.p2p import backend_for
from eagle3_target.protocol.rendezvous import TransferError
from eagle3_target.protocol.wire import CODE_TO_DTYPE

from .errors import Forbidden, InvalidInput, NotFound, ServiceError, TooLarge, TooManySessions
from .p2p.group import SessionGroup, receive
from .p2p.groups import P2PGroups
from .refresh import WeightRefresh
from .sessions import Session
from .weight_source import check_finite, check_layout

log = logging.getLogger(__name__)

MAX_ANNOUNCEMENT_BYTES = 16 << 20  # ~100k tensors' names, dtypes and shapes
MAX_OUTCOME_BYTES = 4 << 10
WEIGHTS_SESSION = "weights-broadcast:"  # the pseudo-session of a trainer's weights broadcast
KEPT_OUTCOMES = 16  # finished transfers whose outcome nobody has asked for yet
SOURCE = "the broadcast"
DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in CODE_TO_DTYPE.values()}
USAGE = '{"version": <label>, "names": [...], "dtypes": ["float32", ...], "shapes": [[...], ...]}'


@dataclass(frozen=True)
class Announcement:
    version: str
    layout: dict[str, tuple[torch.dtype, list[int]]]  # name -> (dtype, shape), in send order


def parse_announcement(body: bytes) -> Announcement:
    if len(body) > MAX_ANNOUNCEMENT_BYTES:
        raise TooLarge(
            "request_entity_too_large", f"an announcement takes at most {MAX_ANNOUNCEMENT_BYTES} bytes"
        )
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        doc = None
    lists = ("names", "dtypes", "shapes")
    if (
        not isinstance(doc, dict)
        or set(doc) != {"version", *lists}
        or not all(isinstance(doc[k], list) for k in lists)
        or not len(doc["names"]) == len(doc["dtypes"]) == len(doc["shapes"])
    ):
        raise InvalidInput("invalid_broadcast", f"the body must be {USAGE}, the three lists of one length")
    try:
        version = check_target_version(doc["version"])
    except ValueError as exc:
        raise InvalidInput("invalid_version", str(exc)) from None
    layout = {}
    for name, dtype, shape in zip(doc["names"], doc["dtypes"], doc["shapes"], strict=True):
        if not isinstance(name, str) or name in layout:
            raise InvalidInput("invalid_broadcast", f"names must be distinct strings, not {str(name)[:80]!r}")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise InvalidInput(
                "invalid_broadcast", f"{name}: dtype {str(dtype)[:40]!r} is none of {sorted(DTYPES)}"
            )
        if not isinstance(shape, list) or not all(type(d) is int and 0 <= d < 1 << 48 for d in shape):
            raise InvalidInput(
                "invalid_broadcast", f"{name}: a shape is a list of sizes, not {str(shape)[:80]}"
            )
        layout[name] = (DTYPES[dtype], shape)
    return Announcement(version, layout)


def check_announcement(layout: Mapping[str, tuple[torch.dtype, list[int]]], served) -> None:
    """The served tensors, each of its shape and dtype exactly (a trainer casts to the served dtype)."""
    # check_layout compares kinds by safetensors' dtype names: F... floating, I... not
    check_layout(
        {
            name: (tuple(shape), "F" if dtype.is_floating_point else "I")
            for name, (dtype, shape) in layout.items()
        },
        served,
        SOURCE,
    )
    for name, (dtype, _) in layout.items():
        if dtype != served[name].dtype:
            raise InvalidInput(
                "source_mismatch", f"{SOURCE}: {name} is {dtype}, the served one {served[name].dtype}"
            )


class WeightBroadcast:
    """Announced transfers, each received and swapped in by a task of its own, under the refresh lock."""

    def __init__(self, refresh: WeightRefresh, p2p: P2PGroups):
        self.refresh, self.p2p = refresh, p2p
        self.transfers: dict[str, asyncio.Task] = {}  # transfer id -> its task: a version or a ServiceError

    async def announce(self, headers: Mapping[str, str], body: bytes, address: str) -> dict:
        """Check the announcement and open the group (``address``: where the request arrived); the reply is
        /init_nccl's authenticated one and the transfer's id."""
        self.refresh.authorize(headers.get("Authorization", ""))
        announced = parse_announcement(body)
        await self.refresh.lock.acquire()  # released once the transfer's task is done
        try:
            runner, served = await self.refresh.served()
            check_announcement(announced.layout, served)
            sg, reply = weights_group(self.p2p, address, runner.info.device)
        except BaseException as exc:
            self.refresh.lock.release()
            if isinstance(exc, ServiceError):
                self.refresh.refused(announced.version, SOURCE, exc)
            raise
        transfer = secrets.token_hex(16)
        self.transfers[transfer] = asyncio.create_task(self._receive(sg, runner, announced))
        self._forget_finished()
        log.info(
            "broadcast %s of version %s announced: %d tensors",
            transfer,
            announced.version,
            len(announced.layout),
        )
        return {**reply, "transfer": transfer}

    async def outcome(self, headers: Mapping[str, str], body: bytes) -> str:
        """The version once the transfer's weights serve; its ServiceError when it was refused."""
        self.refresh.authorize(headers.get("Authorization", ""))
        try:
            transfer = json.loads(body)["transfer"] if len(body) <= MAX_OUTCOME_BYTES else None
        except (ValueError, RecursionError, TypeError, KeyError):
            transfer = None
        if not isinstance(transfer, str):
            raise InvalidInput("invalid_broadcast", 'the body must be {"transfer": <the announcement\'s id>}')
        task = self.transfers.get(transfer)
        if task is None:
            raise NotFound(
                "unknown_transfer", f"no broadcast {transfer[:64]!r} here (or its outcome was read)"
            )
        result = await asyncio.shield(task)
        self.transfers.pop(transfer, None)
        if isinstance(result, ServiceError):
            raise result
        return result

    async def _receive(self, sg: SessionGroup, runner, announced: Announcement) -> str | ServiceError:
        start = time.perf_counter()
        try:
            staged = await receive(sg, announced.layout, self.p2p.options.timeout)
            await asyncio.to_thread(check_finite, staged, SOURCE)
        except TransferError as exc:
            error = InvalidInput("broadcast_incomplete", f"{SOURCE} did not arrive whole: {exc}")
        except ServiceError as exc:
            error = exc
        else:
            error = None
        finally:
            self.p2p.teardown(sg.session, "weights_broadcast")
        try:
            if error is not None:
                self.refresh.refused(announced.version, SOURCE, error)
                return type(error)(error.error, error.detail)  # no traceback: nothing received stays alive
            await self.refresh.swap(runner, staged, announced.version, SOURCE, start)
            del staged
            await asyncio.to_thread(give_back_freed_memory)
            return announced.version
        finally:
            self.refresh.lock.release()

    def _forget_finished(self) -> None:
        finished = [t for t, task in self.transfers.items() if task.done()]
        for transfer in finished[: max(0, len(finished) - KEPT_OUTCOMES)]:
            del self.transfers[transfer]


def give_back_freed_memory() -> None:
    """Hand the heap's free pages back to the system (glibc only): the received tensors, freed, would otherwise
    stay in the process and the next broadcast's buffers not fit in them, so the RSS would climb a copy a time."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def weights_group(p2p: P2PGroups, address: str, device: str) -> tuple[SessionGroup, dict]:
    """An authenticated group of its own for one broadcast, on a port of the p2p range, and the /init_nccl
    reply that tells the trainer how to join it."""
    if not p2p.options.enabled:
        raise Forbidden("p2p_disabled", "this server runs with --disable-p2p: it takes no broadcast weights")
    session = Session(f"{WEIGHTS_SESSION}{secrets.token_hex(8)}", time.monotonic())
    try:
        return p2p.open(session, address, None, backend_for(device), device, authenticated=True)
    except OSError as exc:
        raise TooManySessions("p2p_ports_reserved", str(exc)) from None
