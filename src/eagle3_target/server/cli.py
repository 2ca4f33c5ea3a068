"""`eagle3-target serve`: load a target and serve it over HTTP.

This module imports neither torch nor aiohttp at the top: `serve --help` and every argument error
come before the heavy imports, which `run` makes once the flags are known to be well-formed.
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import logging
from pathlib import Path

from eagle3_target.exits import CommandError, Exit
from eagle3_target.protocol.contract import DEFAULT_PORT, PRIORITIES
from eagle3_target.protocol.engine_spec import COMMON_OPTIONS
from eagle3_target.protocol.engines import engine, engines

from . import generation_options
from .options import (
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_IMAGE_TOKENS,
    DEFAULT_MAX_QUEUED_PER_SESSION,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_PRIORITY,
    EMBEDDED_MODEL,
    ServerOptions,
    UsageError,
)
from .p2p import options as p2p_options
from .parallel import ParallelLayout

log = logging.getLogger(__name__)


def _model(text: str) -> str | None:
    return None if text == EMBEDDED_MODEL else text


def _aux_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        ids = []
    if len(ids) != 3:
        raise argparse.ArgumentTypeError(f"need three layer ids, got {text!r}")
    return ids


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _hosts(text: str) -> list[str]:
    hosts = [h.strip() for h in text.split(",") if h.strip()]
    if not hosts:
        raise argparse.ArgumentTypeError("give at least one address")
    return list(dict.fromkeys(hosts))


def add_arguments(p: argparse.ArgumentParser) -> None:
    _model_arguments(p.add_argument_group("model"))
    _http_arguments(p.add_argument_group("HTTP"))
    _limit_arguments(p.add_argument_group("limits and lifecycle"))
    p2p_options.add_arguments(p.add_argument_group("p2p (tensors over a torch.distributed group, not HTTP)"))
    generation_options.add_arguments(p.add_argument_group("generation (OpenAI-compatible, same weights)"))
    auth = p.add_argument_group("auth")
    auth.add_argument(
        "--auth-token-file",
        type=Path,
        help="require 'Authorization: Bearer <token>' with the token in this file (default: no auth)",
    )
    auth.add_argument(
        "--admin-token-file",
        type=Path,
        help="enable POST /weights/refresh for 'Authorization: Bearer <token>' with the token in this file, "
        "kept from trainers (default: refresh refused)",
    )
    _engine_arguments(p.add_argument_group("engine-specific"))


def _model_arguments(g) -> None:
    g.add_argument(
        "--model",
        type=_model,
        help=f"local directory or hub id (default, or {EMBEDDED_MODEL}: the embedded tiny Llama, no download)",
    )
    g.add_argument(
        "--engine",
        choices=tuple(engines()),
        default="hf",
        help="what runs the forward: "
        + ", ".join(f"{name} ({e.summary})" for name, e in engines().items())
        + " (default hf; docs/engines.md)",
    )
    g.add_argument(
        "--aux-layer-ids", type=_aux_ids, help="three layer ids, e.g. '1,15,28' (default [1, L//2-1, L-4])"
    )
    g.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="default auto: bfloat16 on CUDA, float32 on CPU",
    )
    g.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda:0 (default cpu)")
    g.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let transformers run the model repository's own Python code (default: refused)",
    )


def _http_arguments(g) -> None:
    g.add_argument(
        "--host",
        type=_hosts,
        default=["0.0.0.0"],
        help="HTTP bind addresses, comma-separated: the pod's own on a dual-stack pod ($(POD_IPS)), or :: for "
        "every address of both families (default 0.0.0.0)",
    )
    g.add_argument(
        "--port",
        type=p2p_options.parse_port,
        default=DEFAULT_PORT,
        help=f"HTTP port (default {DEFAULT_PORT})",
    )
    g.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help=f"larger requests get 413 (default {DEFAULT_MAX_BODY_BYTES}: 64 MiB)",
    )
    g.add_argument(
        "--keepalive-timeout",
        type=float,
        default=30.0,
        help="close connections idle, or still sending headers, this many seconds (default 30)",
    )
    g.add_argument(
        "--body-timeout",
        type=float,
        default=30.0,
        help="answer 408 to a request whose body has not arrived in full within this many seconds (default 30)",
    )
    g.add_argument(
        "--write-timeout",
        type=float,
        default=60.0,
        help="drop a client that takes no 4 MiB slice of a response in this many seconds (default 60)",
    )


def _limit_arguments(g) -> None:
    g.add_argument(
        "--max-batch-tokens",
        type=int,
        default=DEFAULT_MAX_BATCH_TOKENS,
        help=f"a /generate with more than this many tokens (batch x sequence) gets 413 "
        f"(default {DEFAULT_MAX_BATCH_TOKENS})",
    )
    g.add_argument(
        "--max-image-tokens",
        type=positive_int,
        default=DEFAULT_MAX_IMAGE_TOKENS,
        help="a feature request whose images take more image tokens than this gets 413 "
        f"(default {DEFAULT_MAX_IMAGE_TOKENS})",
    )
    g.add_argument(
        "--max-sessions",
        type=int,
        default=DEFAULT_MAX_SESSIONS,
        help=f"new client sessions past this many get 429 (default {DEFAULT_MAX_SESSIONS})",
    )
    g.add_argument(
        "--max-queued-per-session",
        type=positive_int,
        default=DEFAULT_MAX_QUEUED_PER_SESSION,
        help="/generate requests one session may have waiting for the model; more get 429 with "
        f"Retry-After (default {DEFAULT_MAX_QUEUED_PER_SESSION}). Sessions take turns either way",
    )
    g.add_argument(
        "--max-priority",
        choices=PRIORITIES,
        default=DEFAULT_PRIORITY,
        help="the highest X-Eagle3-Priority class a request may ask for: low, normal or high, weights "
        "1:2:4 of the model's tokens while sessions wait (default normal; higher asks get 403)",
    )
    g.add_argument(
        "--session-ttl",
        type=float,
        default=3600.0,
        help="end client sessions idle this many seconds (0: never; default 3600)",
    )
    g.add_argument(
        "--drain-timeout",
        type=float,
        default=DEFAULT_DRAIN_TIMEOUT,
        help="on SIGTERM, seconds to finish requests in flight before exiting "
        f"(default {DEFAULT_DRAIN_TIMEOUT:.0f}; keep it under the pod's termination grace period)",
    )
    g.add_argument(
        "--draft-dir-root",
        help="the folder (a shared volume) under which /v1/speculative/evaluate may read draft checkpoints "
        "(default: none, and the endpoint answers 403)",
    )
    g.add_argument(
        "--exit-on-disconnect",
        action="store_true",
        help="NeMo's behaviour: exit after any /disconnect (default: keep serving)",
    )


def _engine_arguments(g) -> None:
    g.add_argument(
        "--tensor-parallel-size",
        type=positive_int,
        default=1,
        help="ranks each layer is split over (default 1)",
    )
    g.add_argument(
        "--pipeline-parallel-size",
        type=positive_int,
        default=1,
        help="ranks the layers are split over (default 1)",
    )
    g.add_argument("--nnodes", type=positive_int, default=1, help="nodes one replica spans (default 1)")
    g.add_argument(
        "--node-rank", type=int, default=0, help="this node's rank in the replica; 0 serves (default 0)"
    )
    g.add_argument("--master-addr", default="127.0.0.1", help="node-rank 0's address, for --nnodes > 1")
    g.add_argument(
        "--master-port", type=int, default=29500, help="node-rank 0's rendezvous port (default 29500)"
    )
    g.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.6,
        help="vllm: the share of GPU memory vLLM takes for weights and KV cache; the rest holds "
        "full-vocab logits (default 0.6)",
    )
    g.add_argument(
        "--forward-delay", type=float, default=0.0, help="synthetic: seconds per forward (default 0)"
    )


def runner_options(args: argparse.Namespace) -> dict:
    """What the engine's loaders take (its table entry's options), the layout included."""
    names = (*COMMON_OPTIONS, *engine(args.engine).options)
    return {**{name: getattr(args, name) for name in names}, "parallel": ParallelLayout.from_args(args)}


def build_loader(args: argparse.Namespace):
    from .runners import load_runner

    return functools.partial(load_runner, args.engine, **runner_options(args))


def check(args: argparse.Namespace) -> None:
    """Everything that can be known wrong before the load; raises UsageError."""
    from . import preflight

    spec = engine(args.engine)
    trust = getattr(args, "trust_remote_code", False)
    # An image-text model is refused before the engine's import, from a local config even without the engine;
    # a hub id with the engine missing gets the missing engine first (looking it up could only fail offline).
    if spec.package is not None and (preflight.local_folder(args.model) or preflight.installed(args.engine)):
        preflight.check_model(args.model)
        preflight.refuse_image_text(args.engine, args.model, trust)
    preflight.check_engine(args.engine)
    preflight.check_device(args.device)
    layout = ParallelLayout.from_args(args)
    if spec.image_text and not layout.single:
        preflight.refuse_image_text(args.engine, args.model, trust, split=True)
    if spec.layers is not None:  # no config to read: the runner's own layer count
        preflight.check_parallel(args.engine, layout)
        preflight.check_aux_layer_ids(args.aux_layer_ids, spec.layers)
        return
    if spec.needs_model and args.model is None:
        raise UsageError(
            f"--engine {args.engine} needs --model: the embedded tiny Llama is for the hf engine"
        )
    preflight.check_model(args.model)
    config = preflight.model_config(args.model, trust)
    preflight.check_parallel(args.engine, layout, config)
    preflight.check_aux_layer_ids(args.aux_layer_ids, config.num_hidden_layers)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def run(args: argparse.Namespace) -> int:
    from .app import TargetServer  # the heavy imports, once the flags are known to be well-formed
    from .process import listen, run_server

    socks = []
    try:
        try:  # first: a taken port is the quickest thing to report
            for host in args.host:
                socks.append(listen(host, args.port))
        except OSError as exc:
            raise UsageError(f"cannot listen on {_address(host, args.port)}: {exc.strerror or exc}") from None
        check(args)
        options = ServerOptions.from_args(args)
    except UsageError as exc:
        for sock in socks:
            sock.close()
        raise CommandError(str(exc), Exit.USAGE) from None
    if options.auth_token is None and not all(_is_loopback(host) for host in args.host):
        log.warning(
            "serving on %s without --auth-token-file: anyone who can reach it can use it", ",".join(args.host)
        )
    log.info(
        "engine %s, model %s, device %s, dtype %s",
        args.engine,
        args.model or EMBEDDED_MODEL,
        args.device,
        args.dtype,
    )
    if args.node_rank > 0:
        from .follower import run_follower

        log.info(
            "node-rank %d of %d: serving /livez only, following node-rank 0", args.node_rank, args.nnodes
        )
        return run_follower(args.engine, runner_options(args), *socks)
    return run_server(TargetServer(build_loader(args), options), *socks)
