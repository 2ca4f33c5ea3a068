"""Point-to-point tensor transport between a target server (rank 0) and one client session (rank 1).

Built from torch alone: a TCPStore (the server is its master), a PrefixStore
laid out as torch's own group helper lays it out, and a process-group backend
object constructed directly -- NCCL for CUDA tensors, gloo for CPU tensors. The
global default group is never touched, so a trainer's own torch.distributed
world is left alone.

Store keys: torch's ``_new_process_group_helper`` prefixes every key with
``"<group_name>/<device>/"`` (device "cuda" for NCCL, "cpu" for gloo). We use
the same layout and NeMo's group name ``nemo_eagle_target_transfer_<port>``,
so a NeMo peer on a compatible torch/NCCL finds our keys.

A transfer is: an optional 8-byte int64 sequence number, then every non-None
tensor in the given order; bool, int8 and int16 travel as uint8 byte views (NeMo's
rule). Gloo aborts the whole process when a receive is posted with a size that
differs from what arrives, so a group that saw any failure must never carry
another transfer: callers close it and build a new one.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import socket
import time
from collections.abc import Mapping

import torch
from torch.distributed import PrefixStore, TCPStore

from .spec import NCCL_GROUP_PREFIX

GLOO = "gloo"
NCCL = "nccl"
SERVER_RANK, CLIENT_RANK = 0, 1
BYTE_VIEW_DTYPES = (torch.bool, torch.int8, torch.int16)

Metadata = Mapping[str, tuple[torch.dtype, list[int]] | None]


class TransferError(RuntimeError):
    """A rendezvous or transfer failed or timed out; the group that raised it is closed."""


def group_name(port: int) -> str:
    return f"{NCCL_GROUP_PREFIX}{port}"


def backend_for(device: torch.device | str) -> str:
    return NCCL if torch.device(device).type == "cuda" else GLOO


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port) for a store master; OSError if another process holds it.

    Binding it ourselves gives the store our pod address (TCPStore alone binds every
    interface) and makes port allocation atomic under hostNetwork.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # REUSEADDR skips TIME_WAIT leftovers of our own earlier groups; Linux still refuses a live listener.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(16)
    except OSError:
        sock.close()
        raise
    return sock


def local_address_towards(host: str) -> str:
    """The local address the kernel would use to reach ``host`` (a UDP connect sends nothing)."""
    family, _, _, _, address = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(address)
        return probe.getsockname()[0]


def _backend(store, rank: int, backend: str, name: str, address: str, timeout: datetime.timedelta):
    prefixed = PrefixStore(f"{name}/", store)
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

    def __init__(self, pg, store, *, rank: int, backend: str, name: str, device: torch.device):
        self._pg, self._store = pg, store
        self.rank, self.backend, self.name, self.device = rank, backend, name, device
        self.closed = False

    @classmethod
    def host(cls, sock: socket.socket, backend: str, timeout: float, device: str = "cpu") -> PeerGroup:
        """Rank 0 on a listening socket from ``listen``; blocks (up to ``timeout``) until the peer joins.

        (NCCL connects lazily, at the first transfer, so for NCCL this returns at once.)
        """
        address, port = sock.getsockname()[:2]
        delta = datetime.timedelta(seconds=timeout)
        try:
            store = TCPStore(
                address, port, 2, True, delta, wait_for_workers=False, master_listen_fd=sock.detach()
            )
        finally:
            sock.close()
        name = group_name(port)
        try:
            pg = _backend(store, SERVER_RANK, backend, name, address, delta)
        except RuntimeError as exc:
            error = f"rendezvous on {address}:{port} failed: {exc}"
        else:
            return cls(pg, store, rank=SERVER_RANK, backend=backend, name=name, device=torch.device(device))
        store = None  # raised without a chained traceback, so nothing keeps the store's port open
        raise TransferError(error)

    @classmethod
    def join(cls, host: str, port: int, backend: str, timeout: float, device: str = "cpu") -> PeerGroup:
        """Rank 1: connect to the server's store at (host, port) and build our side of the group."""
        delta = datetime.timedelta(seconds=timeout)
        name = group_name(port)
        try:
            store = TCPStore(host, port, 2, False, delta)
            pg = _backend(store, CLIENT_RANK, backend, name, local_address_towards(host), delta)
        except (
            RuntimeError,
            OSError,
        ) as exc:  # torch's DistNetworkError and DistStoreError are RuntimeErrors
            error = f"rendezvous with {host}:{port} failed: {exc}"
        else:
            return cls(pg, store, rank=CLIENT_RANK, backend=backend, name=name, device=torch.device(device))
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
        pg = self._pg  # close() from another thread may clear it
        if self.closed or pg is None:
            raise TransferError(f"group {self.name} is closed")
        deadline = time.monotonic() + timeout
        try:
            works = [getattr(pg, op)([buffer], self.peer, 0) for buffer in buffers]
            for work in works:
                self._wait(work, deadline)
        except TransferError:
            self.close()
            raise
        except RuntimeError as exc:
            self.close()
            raise TransferError(f"transfer on {self.name} failed: {exc}") from exc

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

    def close(self) -> None:
        """Abort without waiting for the peer (it may be gone); sockets close once the last reference drops."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(RuntimeError):  # already broken: nothing left to abort
            self._pg.abort()
        self._pg = self._store = None
