"""`eagle3-target serve`: load a target and serve it over HTTP."""

from __future__ import annotations

import argparse
import functools
import ipaddress
import logging
import sys
from pathlib import Path

from eagle3_target.protocol.contract import DEFAULT_PORT, TokenFileError, read_token_file

from . import preflight
from .app import (
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_MAX_BODY_BYTES,
    ServerOptions,
    TargetServer,
    listen,
    run_server,
)
from .dataplane import PortRange
from .runners.base import EMBEDDED_MODEL
from .sessions import DEFAULT_MAX_SESSIONS

log = logging.getLogger(__name__)


def _model(text: str) -> str | None:
    return None if text == EMBEDDED_MODEL else text


def _aux_ids(text: str) -> list[int]:
    ids = [int(x) for x in text.replace(",", " ").split()]
    if len(ids) != 3:
        raise argparse.ArgumentTypeError(f"need three layer ids, got {text!r}")
    return ids


def _port_range(text: str) -> PortRange:
    try:
        return PortRange.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _hosts(text: str) -> list[str]:
    hosts = [h.strip() for h in text.split(",") if h.strip()]
    if not hosts:
        raise argparse.ArgumentTypeError("give at least one address")
    return list(dict.fromkeys(hosts))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        type=_model,
        help=f"local directory or hub id; default (or {EMBEDDED_MODEL}): the embedded tiny Llama (no download)",
    )
    p.add_argument("--engine", choices=["hf", "sglang", "vllm", "synthetic"], default="hf")
    p.add_argument(
        "--host",
        type=_hosts,
        default=["0.0.0.0"],
        help="HTTP bind addresses, comma-separated: the pod's own on a dual-stack pod ($(POD_IPS)), or :: for "
        "every address of both families (default 0.0.0.0)",
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="HTTP port (default %(default)s)")
    p.add_argument(
        "--nccl-port",
        type=int,
        help="rendezvous port tried first for a client that names none; must lie in --nccl-port-range "
        "(default: the range's first port)",
    )
    p.add_argument(
        "--nccl-port-range",
        type=_port_range,
        help="the only ports point-to-point groups may use, e.g. 8101-8164; a port a client names "
        "outside it gets 400; give pods sharing a node (hostNetwork) disjoint ranges "
        "(default: --port+100 to --port+163)",
    )
    p.add_argument(
        "--disable-p2p",
        action="store_true",
        help="answer /init_nccl with 'disabled': every /generate goes over the wire",
    )
    p.add_argument(
        "--p2p-timeout",
        type=float,
        default=120.0,
        help="seconds for each point-to-point transfer (default 120)",
    )
    p.add_argument(
        "--p2p-rendezvous-timeout",
        type=float,
        default=30.0,
        help="seconds a client has to join its group after /init_nccl before the port is freed (default 30)",
    )
    p.add_argument(
        "--p2p-idle-timeout",
        type=float,
        default=45.0,
        help="a heartbeating client silent this many seconds loses its group (default 45: three of "
        "the client's 15 s heartbeats)",
    )
    p.add_argument(
        "--allow-unauthenticated-p2p",
        action="store_true",
        help="with --auth-token-file, still accept NeMo's unauthenticated /init_nccl (anyone who "
        "reaches the rendezvous port first may then receive that client's tensors)",
    )
    p.add_argument(
        "--aux-layer-ids", type=_aux_ids, help="three layer ids, e.g. '1,15,28' (default [1, L//2-1, L-4])"
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="auto: bfloat16 on CUDA, float32 on CPU",
    )
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda:0 (default cpu)")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument(
        "--auth-token-file", type=Path, help="require 'Authorization: Bearer <token>' from this file"
    )
    p.add_argument(
        "--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="larger requests get 413"
    )
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        default=DEFAULT_MAX_BATCH_TOKENS,
        help=f"a /generate with more than this many tokens (batch x sequence) gets 413 "
        f"(default {DEFAULT_MAX_BATCH_TOKENS})",
    )
    p.add_argument(
        "--keepalive-timeout",
        type=float,
        default=30.0,
        help="close connections idle, or still sending headers, this many seconds (default 30)",
    )
    p.add_argument(
        "--write-timeout",
        type=float,
        default=60.0,
        help="drop a client that takes no 4 MiB slice of a response in this many seconds (default 60)",
    )
    p.add_argument(
        "--max-sessions",
        type=int,
        default=DEFAULT_MAX_SESSIONS,
        help=f"new client sessions past this many get 429 (default {DEFAULT_MAX_SESSIONS})",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=DEFAULT_DRAIN_TIMEOUT,
        help="on SIGTERM, seconds to finish requests in flight before exiting "
        f"(default {DEFAULT_DRAIN_TIMEOUT:.0f}; keep it under the pod's termination grace period)",
    )
    p.add_argument(
        "--session-ttl",
        type=float,
        default=3600.0,
        help="end client sessions idle this many seconds (0: never; default 3600)",
    )
    p.add_argument(
        "--exit-on-disconnect", action="store_true", help="NeMo's behaviour: exit after any /disconnect"
    )
    p.add_argument(
        "--tensor-parallel-size", type=int, default=1, help="vllm engine: GPUs per model (default 1)"
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.6,
        help="vllm engine: the share of GPU memory vLLM takes for weights and KV cache; the rest holds "
        "full-vocab logits (default 0.6)",
    )
    p.add_argument("--forward-delay", type=float, default=0.0, help="synthetic engine: seconds per forward")


def build_loader(args: argparse.Namespace):
    from .runners import load_runner

    options = dict(model=args.model, dtype=args.dtype, device=args.device, aux_layer_ids=args.aux_layer_ids)
    if args.engine == "synthetic":
        options.update(forward_delay=args.forward_delay)
    else:
        options.update(trust_remote_code=args.trust_remote_code)
    if args.engine == "vllm":
        options.update(
            tensor_parallel_size=args.tensor_parallel_size,
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_batch_tokens=args.max_batch_tokens,  # vLLM schedules that many tokens in one step
        )
    return functools.partial(load_runner, args.engine, **options)


def check(args: argparse.Namespace) -> None:
    """Everything that can be known wrong before the load; raises preflight.UsageError."""
    preflight.check_engine(args.engine)
    preflight.check_device(args.device)
    if args.engine == "synthetic":
        preflight.check_aux_layer_ids(args.aux_layer_ids, 32)  # the synthetic runner's layer count
        return
    if args.engine == "sglang" and args.model is None:
        raise preflight.UsageError(
            "--engine sglang needs --model: the embedded tiny Llama is for the hf engine"
        )
    preflight.check_model(args.model)
    preflight.check_aux_layer_ids(
        args.aux_layer_ids, preflight.num_hidden_layers(args.model, args.trust_remote_code)
    )


def _read_token(path: Path | None) -> str | None:
    try:
        return None if path is None else read_token_file(path)
    except TokenFileError as exc:
        raise preflight.UsageError(f"--auth-token-file {exc}") from None


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _nccl_ports(args: argparse.Namespace) -> tuple[PortRange, int]:
    """The rendezvous port range and the port tried first, which must lie in it."""
    ports = args.nccl_port_range or PortRange(args.port + 100, args.port + 163)
    nccl_port = ports.start if args.nccl_port is None else args.nccl_port
    if nccl_port not in ports:
        raise preflight.UsageError(f"--nccl-port {nccl_port} is outside --nccl-port-range {ports}")
    return ports, nccl_port


def run(args: argparse.Namespace) -> int:
    socks = []
    try:
        for host in args.host:  # first: a taken port is the quickest thing to report
            socks.append(listen(host, args.port))
    except OSError as exc:
        for sock in socks:
            sock.close()
        print(
            f"eagle3-target serve: error: cannot listen on {_address(host, args.port)}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2
    try:
        check(args)
        token = _read_token(args.auth_token_file)
        ports, nccl_port = _nccl_ports(args)
    except preflight.UsageError as exc:
        for sock in socks:
            sock.close()
        print(f"eagle3-target serve: error: {exc}", file=sys.stderr)
        return 2
    if token is None and not all(_is_loopback(host) for host in args.host):
        log.warning(
            "serving on %s without --auth-token-file: anyone who can reach it can use it", ",".join(args.host)
        )
    options = ServerOptions(
        max_body_bytes=args.max_body_bytes,
        max_batch_tokens=args.max_batch_tokens,
        keepalive_timeout=args.keepalive_timeout,
        max_sessions=args.max_sessions,
        drain_timeout=args.drain_timeout,
        write_timeout=args.write_timeout,
        session_ttl=args.session_ttl,
        exit_on_disconnect=args.exit_on_disconnect,
        auth_token=token,
        nccl_port=nccl_port,
        nccl_port_range=ports,
        p2p=not args.disable_p2p,
        p2p_timeout=args.p2p_timeout,
        p2p_rendezvous_timeout=args.p2p_rendezvous_timeout,
        p2p_idle_timeout=args.p2p_idle_timeout,
        allow_unauthenticated_p2p=args.allow_unauthenticated_p2p,
    )
    log.info(
        "engine %s, model %s, device %s, dtype %s",
        args.engine,
        args.model or EMBEDDED_MODEL,
        args.device,
        args.dtype,
    )
    return run_server(TargetServer(build_loader(args), options), *socks)
