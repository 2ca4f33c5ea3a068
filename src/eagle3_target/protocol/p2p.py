"""The p2p path's groups: a two-rank process group between a target server (rank 0) and one
client session (rank 1), and the transfers over it.

Built from torch alone: a TCPStore (the server is its master; see rendezvous.py),
a PrefixStore laid out as torch's own group helper lays it out, and a
process-group backend object constructed directly -- NCCL for CUDA tensors, gloo
for CPU tensors. The global default group is never touched, so a trainer's own
torch.distributed world is left alone.

A transfer is: an optional 8-byte int64 sequence number, then every non-None
tensor in the given order; bool, int8 and int16 travel as uint8 byte views (NeMo's
rule). Gloo aborts the whole process when a receive is posted with a size that
differs from what arrives, so a group that saw any failure must never carry
another transfer: callers close it and build a new one.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import math
import secrets
import socket
import threading
import time
from collections.abc import Mapping

import torch
from torch.distributed import PrefixStore, TCPStore

from .metadata import Metadata
from .rendezvous import (
    PeerRejected,
    TransferError,
    await_hello,
    group_name,
    hang_up,
    hello,
    local_address_towards,
    mac,
    store_namespace,
    within,
)

GLOO = "gloo"
NCCL = "nccl"
SERVER_RANK, CLIENT_RANK = 0, 1
BYTE_VIEW_DTYPES = (torch.bool, torch.int8, torch.int16)
NONCE_BYTES = 32


def backend_for(device: torch.device | str) -> str:
    return NCCL if torch.device(device).type == "cuda" else GLOO


def _backend(store, rank: int, backend: str, name: str, namespace: str, address: str, timeout):
    prefixed = PrefixStore(f"{namespace}/", store)
    if backend == GLOO:
        from torch.distributed import ProcessGroupGloo

        options = ProcessGroupGloo._Options()
        options._timeout = timeout
        # Gloo's default device resolves the hostname; bind the data sockets where the store is.
        options._devices = [ProcessGroupGloo.create_device(hostname=address)]
        return ProcessGroupGloo(PrefixStore("cpu/", prefixed), rank, 2, options)
    if backend == NCCL:
        from torch.distributed import ProcessGroupNCCL  # absent from CPU builds of torch

        options = ProcessGroupNCCL.Options()
        options.is_high_priority_stream = False
        options._timeout = timeout
        options.group_name = name
        return ProcessGroupNCCL(PrefixStore("cuda/", prefixed), rank, 2, options)
    raise ValueError(f"unknown backend {backend!r}; choose {GLOO} or {NCCL}")


class PeerGroup:
    """One side of a two-rank group. Not thread-safe: one transfer at a time."""

    def __init__(self, pg, store, *, rank: int, backend: str, name: str, device: torch.device | str):
        self._pg, self._store = pg, store
        self.rank, self.backend, self.name, self.device = rank, backend, name, torch.device(device)
        self.closed = False
        self._busy = threading.Lock()  # held while a transfer is in flight

    @classmethod
    def host(
        cls,
        sock: socket.socket,
        backend: str,
        timeout: float,
        device: str = "cpu",
        *,
        secret: str | None = None,
        cancelled: threading.Event | None = None,
    ) -> PeerGroup:
        """Rank 0 on a listening socket from ``listen``; blocks (up to ``timeout``) until the peer joins.

        With a secret the peer must prove it (see the module docstring); until its hello arrives
        the wait ends early once ``cancelled`` is set. Without one NCCL returns at once (it
        connects lazily, at the first transfer).
        """
        address, port = sock.getsockname()[:2]
        deadline = time.monotonic() + timeout
        delta = datetime.timedelta(seconds=timeout)
        try:
            store = TCPStore(
                address, port, 2, True, delta, wait_for_workers=False, master_listen_fd=sock.detach()
            )
        finally:
            sock.close()
        namespace = store_namespace(port, secret)
        try:
            if secret is not None:
                await_hello(PrefixStore(f"{namespace}/", store), secret, deadline, cancelled)
            pg = _backend(store, SERVER_RANK, backend, group_name(port), namespace, address, delta)
            group = cls(pg, store, rank=SERVER_RANK, backend=backend, name=group_name(port), device=device)
        except RuntimeError as exc:  # torch's DistNetworkError and DistStoreError are RuntimeErrors
            ours = isinstance(exc, TransferError)
            kind, error = (
                (type(exc), str(exc)) if ours else (TransferError, f"rendezvous on {address}:{port}: {exc}")
            )
        else:
            store = None  # the group holds it now
            if secret is not None:
                _challenge(group, secret, deadline)
            return group
        store = None  # raised without a chained traceback, so nothing keeps the store's port open
        raise kind(error)

    @classmethod
    def join(
        cls,
        host: str,
        port: int,
        backend: str,
        timeout: float,
        device: str = "cpu",
        *,
        secret: str | None = None,
    ) -> PeerGroup:
        """Rank 1: connect to the server's store at (host, port) and build our side, within ``timeout``."""
        return within(
            timeout,
            lambda: cls._join(host, port, backend, timeout, device, secret),
            f"rendezvous with {host}:{port}",
            lambda: hang_up(host, port),
        )

    @classmethod
    def _join(cls, host: str, port: int, backend: str, timeout: float, device: str, secret: str | None):
        deadline = time.monotonic() + timeout
        delta = datetime.timedelta(seconds=timeout)
        namespace = store_namespace(port, secret)
        try:
            store = TCPStore(host, port, 2, False, delta)
            if secret is not None:
                PrefixStore(f"{namespace}/", store).set(*hello(secret))
            address = local_address_towards(host)
            pg = _backend(store, CLIENT_RANK, backend, group_name(port), namespace, address, delta)
        except (RuntimeError, OSError) as exc:
            error = f"rendezvous with {host}:{port} failed: {exc}"
        else:
            group = cls(pg, store, rank=CLIENT_RANK, backend=backend, name=group_name(port), device=device)
            if secret is not None:
                _answer(group, secret, deadline)
            return group
        store = None  # as in host(): let the store's connection go now
        raise TransferError(error)

    @property
    def peer(self) -> int:
        return CLIENT_RANK if self.rank == SERVER_RANK else SERVER_RANK

    # -- transfers -------------------------------------------------------------------------

    def send(self, tensors: Mapping[str, torch.Tensor | None], seq: int | None, timeout: float) -> int:
        """Send ``seq`` (if given) then each non-None tensor in order; return the tensor bytes sent."""
        buffers = [] if seq is None else [self._seq_tensor(seq)]
        for tensor in tensors.values():
            if tensor is not None:
                buffers.append(self._outgoing(tensor))
        self._run(buffers, "send", timeout)
        return sum(b.numel() * b.element_size() for b in buffers[0 if seq is None else 1 :])

    def recv(self, metadata: Metadata, seq: int | None, timeout: float) -> dict[str, torch.Tensor | None]:
        """Receive what ``send`` sent, sized from ``metadata``; check the sequence number if one is expected."""
        incoming = {key: None if meta is None else self._incoming(*meta) for key, meta in metadata.items()}
        head = [] if seq is None else [self._seq_tensor(-1)]
        self._run(head + [b for b in incoming.values() if b is not None], "recv", timeout)
        if seq is not None and int(head[0].item()) != seq:
            self.close()
            raise TransferError(
                f"sequence mismatch: expected transfer {seq}, the server sent {int(head[0].item())}"
            )
        return {
            key: None if buf is None else buf.view(metadata[key][0]).view(metadata[key][1])
            for key, buf in incoming.items()
        }

    def _incoming(self, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
        if dtype in BYTE_VIEW_DTYPES:
            numel = math.prod(shape)
            return torch.empty(
                numel * torch.empty((), dtype=dtype).element_size(), dtype=torch.uint8, device=self.device
            )
        return torch.empty(shape, dtype=dtype, device=self.device)

    def _seq_tensor(self, seq: int) -> torch.Tensor:
        return torch.tensor([seq], dtype=torch.int64, device=self.device)

    def _outgoing(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.to(self.device).contiguous()
        # One flat byte buffer of numel x element_size, exactly what the receiver allocates.
        return tensor.reshape(-1).view(torch.uint8) if tensor.dtype in BYTE_VIEW_DTYPES else tensor

    def _run(self, buffers: list[torch.Tensor], op: str, timeout: float) -> None:
        """Post every send or recv (the pair keeps their order), then wait for all within ``timeout`` seconds."""
        with self._busy:
            error = self._post_and_wait(buffers, op, timeout)
        # Raised only here, once the frames that held the process group are gone: a traceback
        # through them would keep a closed group (and its store's port) alive.
        if error is not None:
            raise TransferError(error)

    def _post_and_wait(self, buffers: list[torch.Tensor], op: str, timeout: float) -> str | None:
        """None, or why the transfer failed (the group is then closed)."""
        pg = self._pg  # close() from another thread may clear it
        if self.closed or pg is None:
            return f"group {self.name} is closed"
        deadline = time.monotonic() + timeout
        try:
            for work in [getattr(pg, op)([buffer], self.peer, 0) for buffer in buffers]:
                self._wait(work, deadline)
        except TransferError as exc:
            error = str(exc)
        except RuntimeError as exc:
            error = f"transfer on {self.name} failed: {exc}"
        else:
            return None
        self.close()
        return error

    def _wait(self, work, deadline: float) -> None:
        left = deadline - time.monotonic()
        if self.backend == GLOO:
            if left <= 0 or not work.wait(datetime.timedelta(seconds=left)):
                raise TransferError(f"transfer on {self.name} timed out")
            return
        # NCCL: poll instead of blocking, so we abort on our own deadline before the watchdog
        # (whose default is to tear the whole process down) ever fires.
        while not work.is_completed():
            if time.monotonic() > deadline:
                raise TransferError(f"transfer on {self.name} timed out")
            time.sleep(0.0005)
        work.wait()  # orders the caller's CUDA stream after the transfer

    def drained(self) -> None:
        """Block until no transfer is in flight. Gloo's abort does not interrupt one: it ends at its
        deadline, and only then does the group (and its store's port) go."""
        with self._busy:
            pass

    def close(self) -> None:
        """Abort without waiting for the peer (it may be gone); sockets close once the last reference drops."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(RuntimeError):  # already broken: nothing left to abort
            self._pg.abort()
        self._pg = self._store = None


def _challenge(group: PeerGroup, secret: str, deadline: float) -> None:
    """The host's half of the proof of the group's secret, over the group itself: send a nonce, check its MAC."""
    nonce = torch.frombuffer(bytearray(secrets.token_bytes(NONCE_BYTES)), dtype=torch.uint8)
    proof = torch.empty(hashlib.sha256().digest_size, dtype=torch.uint8, device=group.device)
    group._run([nonce.to(group.device)], "send", deadline - time.monotonic())
    group._run([proof], "recv", deadline - time.monotonic())
    expected = mac(secret, b"proof", nonce.numpy().tobytes())
    if not hmac.compare_digest(proof.cpu().numpy().tobytes(), expected):
        group.close()
        raise PeerRejected(f"the peer of {group.name} failed to prove the group's secret")


def _answer(group: PeerGroup, secret: str, deadline: float) -> None:
    """The joiner's half: the MAC of the host's nonce."""
    nonce = torch.empty(NONCE_BYTES, dtype=torch.uint8, device=group.device)
    group._run([nonce], "recv", deadline - time.monotonic())
    proof = mac(secret, b"proof", nonce.cpu().numpy().tobytes())
    group._run(
        [torch.frombuffer(bytearray(proof), dtype=torch.uint8).to(group.device)],
        "send",
        deadline - time.monotonic(),
    )
