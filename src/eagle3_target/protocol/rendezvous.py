"""How the two sides of a p2p group find each other and prove who they are.

The server (rank 0) is the master of a TCPStore on a socket it bound itself; the
client (rank 1) connects to it. Store keys follow torch's own group helper,
``"<group_name>/<device>/"`` (device "cuda" for NCCL, "cpu" for gloo), under
NeMo's group name ``nemo_eagle_target_transfer_<port>``, so a NeMo peer on a
compatible torch/NCCL finds our keys.

Authenticated mode (our client): the server hands the client a per-group secret in the
(bearer-token protected) /init_nccl reply. The secret never enters the store, which anyone
who can reach the port may read in full (TCPStore answers ``list_keys``). Keys live under a
namespace derived from the secret; the client proves itself with a hello key before the
server builds its side, and, once the group is up, by answering a fresh nonce with an HMAC
over the group itself before any tensor is sent (p2p.py). Only the last step is the
guarantee: it holds whoever ended up as the peer (store, gloo listener or NCCL bootstrap).
Without a secret the layout is NeMo's and nothing is checked.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from torch.distributed import PrefixStore

from .contract import NCCL_GROUP_PREFIX

HELLO_POLL = 0.25  # seconds between checks for a cancelled rendezvous
UNBLOCK_GRACE = 2.0  # seconds a rendezvous thread gets to return once unblocked


class Closable(Protocol):
    def close(self) -> None: ...


G = TypeVar("G", bound=Closable)


class TransferError(RuntimeError):
    """A rendezvous or transfer failed or timed out; the group that raised it is closed."""


class PeerRejected(TransferError):
    """The peer could not prove it holds the group's secret."""


def group_name(port: int) -> str:
    return f"{NCCL_GROUP_PREFIX}{port}"


def new_secret() -> str:
    return secrets.token_hex(32)


def mac(secret: str, *parts: bytes) -> bytes:
    return hmac.new(bytes.fromhex(secret), b"\0".join(parts), hashlib.sha256).digest()


def store_namespace(port: int, secret: str | None) -> str:
    """Where a group's keys live: NeMo's ``<group_name>`` layout, or under a secret-derived name."""
    name = group_name(port)
    return name if secret is None else f"{name}/{mac(secret, b'namespace').hex()[:32]}"


def hello(secret: str) -> tuple[str, bytes]:
    """(key under the namespace, value) by which a client announces it holds the secret."""
    return "hello", mac(secret, b"hello")


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


def hang_up(host: str, port: int) -> None:
    """Shut down this process's connections to (host, port), so that a torch call blocked on one returns.

    TCPStore's client can wait forever on a peer that accepted and went silent; its socket
    is not ours to close, but shutting it down makes the blocked call fail.
    """
    if not os.path.isdir("/proc/self/fd"):
        return  # not Linux: the call stays blocked until torch gives up on its own
    peer = (_ip(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0]), port)
    for fd in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue  # not a socket, or already gone
        with sock, contextlib.suppress(OSError):
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                address, remote_port = sock.getpeername()[:2]
                if (_ip(address), remote_port) == peer:
                    sock.shutdown(socket.SHUT_RDWR)


def _ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    ip = ipaddress.ip_address(address)
    return getattr(ip, "ipv4_mapped", None) or ip  # torch connects over IPv6 sockets


def within(timeout: float, build: Callable[[], G], what: str, give_up: Callable[[], None] | None = None) -> G:
    """Run a blocking rendezvous on a daemon thread and give up after ``timeout`` seconds.

    torch's own deadlines do not cover every wait of a rendezvous. On giving up ``give_up``
    unblocks the thread (a thread left inside torch at exit aborts the process), and a group
    that completes anyway is closed.
    """
    lock = threading.Lock()
    outcome: list = []  # the group or the exception, unless we gave up first
    gave_up: list[bool] = []
    finished = threading.Event()

    def run() -> None:
        try:
            result = build()
        except BaseException as exc:  # handed to the caller, whatever it is
            result = exc
        with lock:
            if not gave_up:
                outcome.append(result)
                finished.set()
                return
        if not isinstance(result, BaseException):
            result.close()

    thread = threading.Thread(target=run, daemon=True, name=f"rendezvous {what}")
    thread.start()
    finished.wait(timeout)
    with lock:
        if not outcome:
            gave_up.append(True)
    if gave_up:
        if give_up is not None:
            give_up()
            thread.join(UNBLOCK_GRACE)  # let it leave torch before our caller might exit
        raise TransferError(f"{what} did not complete within {timeout:g}s")
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def await_hello(store: PrefixStore, secret: str, deadline: float, cancelled: threading.Event | None):
    """Wait for the client's hello, in short steps so that a cancelled rendezvous ends soon."""
    key, value = hello(secret)
    pause = 0.001  # doubling up to HELLO_POLL: a client that joins at once is seen within a few ms
    while not store.check([key]):
        if cancelled is not None and cancelled.is_set():
            raise TransferError("rendezvous cancelled")
        if time.monotonic() >= deadline:
            raise TransferError("no client arrived before the rendezvous timeout")
        time.sleep(pause)
        pause = min(2 * pause, HELLO_POLL)
    if not hmac.compare_digest(store.get(key), value):
        raise PeerRejected("a peer announced itself with a wrong hello")
