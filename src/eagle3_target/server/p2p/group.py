"""One session's p2p group, from /init_nccl until its port is free again, and one transfer over it (a reply's
tensors sent, or a trainer's weights received).

Blocking torch calls run on daemon threads, never on the event loop, each with a deadline, and never
hold up the process's exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Mapping

import torch

from eagle3_target.protocol import contract
from eagle3_target.protocol.metadata import Metadata
from eagle3_target.protocol.p2p import PeerGroup
from eagle3_target.protocol.rendezvous import TransferError, group_name, hang_up

from ..sessions import Session


def _off_loop(fn: Callable, *args, name: str) -> asyncio.Future:
    """Run a blocking torch call on a daemon thread: never on the event loop, never holding up exit."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result, error) -> None:
        if not future.done():
            future.set_result(result) if error is None else future.set_exception(error)

    def run() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as exc:  # handed to the awaiting task
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: the process is exiting
            loop.call_soon_threadsafe(settle, result, error)
        del result, error  # else this frame and the exception's traceback form a cycle

    threading.Thread(target=run, daemon=True, name=name).start()
    return future


def _close_and_drain(group: PeerGroup) -> None:
    group.close()
    group.drained()


class SessionGroup:
    """A session's group, from /init_nccl until its port is free again."""

    def __init__(
        self, session: Session, address: str, port: int, secret: str | None, on_released: Callable[[], None]
    ):
        self.session, self.address, self.port, self.secret = session, address, port, secret
        self.ready = asyncio.get_running_loop().create_future()  # the PeerGroup, or None if it never will be
        self.failure: TransferError | None = None
        self.next_seq = 0
        self.lock = asyncio.Lock()  # one transfer at a time, in request order
        self._cancel = threading.Event()  # tells a pending rendezvous to give up
        self._on_released = on_released
        self._ended = False

    def start(self, sock, backend: str, timeout: float, device: str, on_failed: Callable) -> None:
        host = functools.partial(
            PeerGroup.host, sock, backend, timeout, device, secret=self.secret, cancelled=self._cancel
        )
        build = _off_loop(host, name=f"p2p rendezvous {self.port}")
        build.add_done_callback(lambda done: self._built(done, on_failed))

    def _built(self, build: asyncio.Future, on_failed: Callable) -> None:
        group = None if build.exception() is not None else build.result()
        if self._ended:  # torn down while the rendezvous ran
            self._release(group)
        elif group is None:
            self.failure = build.exception()
            self.ready.set_result(None)
            on_failed(self)
        else:
            self.ready.set_result(group)

    def end(self) -> None:
        """Cancel a pending rendezvous or abort the group; the port is released once that is done."""
        if self._ended:
            return
        self._ended = True
        self._cancel.set()
        if not self.ready.done():
            self.ready.set_result(None)  # waiters stop waiting; _built releases when the rendezvous returns
            # torch may be blocked on the store; breaking its connections makes it return now.
            _off_loop(hang_up, self.address, self.port, name=f"p2p hang up {self.port}")
        else:
            self._release(self.ready.result())

    def _release(self, group: PeerGroup | None) -> None:
        if group is None:
            self._on_released()
        else:
            abort = _off_loop(_close_and_drain, group, name=f"p2p abort {self.port}")
            abort.add_done_callback(lambda _: self._on_released())


class Transfer:
    """One /generate answered over the group: send() after the response's metadata is flushed."""

    def __init__(
        self,
        sg: SessionGroup,
        group: PeerGroup,
        seq: int | None,
        timeout: float,
        teardown: Callable[[Session, str], None],
    ):
        self.sg, self.group, self.timeout, self._teardown = sg, group, timeout, teardown
        self.seq = seq  # the client's sequence number, None for a NeMo client (sends no header)

    def response_headers(self) -> dict[str, str]:
        headers = {contract.NCCL_HEADER: "1"}
        if self.seq is not None:
            headers[contract.SEQUENCE_HEADER] = str(self.seq)
        return headers

    async def send(self, tensors: Mapping[str, torch.Tensor | None]) -> int:
        """Send ``tensors`` in order; return the bytes sent. TransferError leaves the session on the wire."""
        send = functools.partial(self.group.send, tensors, self.seq, self.timeout)
        try:
            sent = await _off_loop(send, name=f"p2p send {self.sg.port}")
        except BaseException as exc:  # a cancelled send leaves the group mid-transfer: it goes too
            cancelled = isinstance(exc, asyncio.CancelledError)
            self._teardown(self.sg.session, "cancelled" if cancelled else "send_failed")
            if isinstance(exc, TransferError) or not isinstance(exc, Exception):
                raise
            raise TransferError(f"send on {self.group.name} failed: {exc!r}") from exc
        self.sg.next_seq += 1
        return sent


async def receive(sg: SessionGroup, metadata: Metadata, timeout: float) -> dict[str, torch.Tensor | None]:
    """What ``metadata`` announces, received over ``sg``'s group once its peer has joined and proved itself,
    within ``timeout`` seconds. The TransferError for a peer that never joined, failed or stalled carries no
    frame that holds a received buffer, so a failed transfer's memory goes at once."""
    async with sg.lock:  # a group in use is no silent one (P2PGroups.watch)
        group = await asyncio.shield(sg.ready)
        if group is None or group.closed:
            raise TransferError(f"no peer joined {group_name(sg.port)}: {sg.failure or 'torn down'}")
        try:
            recv = functools.partial(group.recv, metadata, None, timeout)
            return await _off_loop(recv, name=f"p2p receive {sg.port}")
        except TransferError as exc:
            error = str(exc)
    raise TransferError(error)
