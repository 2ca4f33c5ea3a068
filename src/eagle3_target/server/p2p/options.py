"""The p2p path's settings and their `serve` flags, defined once (no torch: parsed before any heavy import)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class PortRange:
    start: int
    end: int  # inclusive

    @classmethod
    def parse(cls, text: str) -> PortRange:
        first, sep, last = text.partition("-")
        try:
            ports = cls(int(first), int(last if sep else first))
        except ValueError:
            raise ValueError(f"port range must look like START-END, got {text!r}") from None
        if not 1 <= ports.start <= ports.end <= 65535:
            raise ValueError(f"port range {text!r} is not within 1-65535 with START <= END")
        return ports

    def __iter__(self):
        return iter(range(self.start, self.end + 1))

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.start <= port <= self.end

    def __len__(self) -> int:
        return self.end - self.start + 1

    def __str__(self) -> str:
        return f"{self.start}-{self.end}"


@dataclass(frozen=True)
class P2POptions:
    enabled: bool = True
    port: int | None = None  # tried first for a client that names no port; inside port_range
    port_range: PortRange | None = None  # the rendezvous ports; a port a client names must lie in it
    timeout: float = 120.0  # each transfer
    rendezvous_timeout: float = 30.0  # an /init_nccl nobody completes frees its port after this
    idle_timeout: float = 45.0  # a heartbeating session silent this long loses its group
    allow_unauthenticated: bool = False  # NeMo's mode, when the server has an auth token

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> P2POptions:
        """From `serve`'s flags; the range defaults to --port+100 to --port+163. ValueError names a bad flag."""
        ports = args.nccl_port_range or PortRange(args.port + 100, args.port + 163)
        port = ports.start if args.nccl_port is None else args.nccl_port
        if port not in ports:
            raise ValueError(f"--nccl-port {port} is outside --nccl-port-range {ports}")
        return cls(
            enabled=not args.disable_p2p,
            port=port,
            port_range=ports,
            timeout=args.p2p_timeout,
            rendezvous_timeout=args.p2p_rendezvous_timeout,
            idle_timeout=args.p2p_idle_timeout,
            allow_unauthenticated=args.allow_unauthenticated_p2p,
        )


def _port_range(text: str) -> PortRange:
    try:
        return PortRange.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_port(text: str) -> int:
    """argparse type for a TCP port: one line, not an OverflowError, for 99999."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (1-65535)")
    return port


def add_arguments(group: argparse._ArgumentGroup) -> None:
    """The p2p flags. `nccl` in two of them is NeMo's name (its /init_nccl body's nccl_port)."""
    d = P2POptions()
    group.add_argument(
        "--nccl-port",
        type=parse_port,
        help="rendezvous port tried first for a client that names none; must lie in --nccl-port-range "
        "(default: the range's first port)",
    )
    group.add_argument(
        "--nccl-port-range",
        type=_port_range,
        help="the only ports p2p groups may use, e.g. 8101-8164; a port a client names outside it gets "
        "400; give pods sharing a node (hostNetwork) disjoint ranges (default: --port+100 to --port+163)",
    )
    group.add_argument(
        "--disable-p2p",
        action="store_true",
        help="answer /init_nccl with 'disabled': every /generate goes over HTTP (default: p2p enabled)",
    )
    group.add_argument(
        "--p2p-timeout",
        type=float,
        default=d.timeout,
        help=f"seconds for each p2p transfer (default {d.timeout:g})",
    )
    group.add_argument(
        "--p2p-rendezvous-timeout",
        type=float,
        default=d.rendezvous_timeout,
        help="seconds a client has to join its group after /init_nccl before the port is freed "
        f"(default {d.rendezvous_timeout:g})",
    )
    group.add_argument(
        "--p2p-idle-timeout",
        type=float,
        default=d.idle_timeout,
        help=f"a heartbeating client silent this many seconds loses its group (default {d.idle_timeout:g}: "
        "three of the client's 15 s heartbeats)",
    )
    group.add_argument(
        "--allow-unauthenticated-p2p",
        action="store_true",
        help="with --auth-token-file, still accept NeMo's unauthenticated /init_nccl (anyone who reaches "
        "the rendezvous port first may then receive that client's tensors; default: refused)",
    )
