"""`eagle3-target bench`: arguments (standard library only, so --help needs no extra) and run()."""

from __future__ import annotations

import argparse

from eagle3_target.exits import CommandError, Exit
from eagle3_target.protocol.choices import AUTO, DATA_PATHS, ENCODING_CHOICES

from .cli_probe import add_endpoint_arguments


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_endpoint_arguments(p)
    p.add_argument("--batch-size", type=positive_int, default=1, help="sequences per batch")
    p.add_argument("--seq-len", type=positive_int, default=2048, help="tokens per sequence")
    p.add_argument(
        "--draft-vocab", type=positive_int, help="draft vocabulary size (default: the full target vocab)"
    )
    p.add_argument("--batches", type=positive_int, default=50, help="timed batches")
    p.add_argument(
        "--warmup", type=int, default=3, help="untimed batches first, shown apart (at least 1 is run)"
    )
    p.add_argument(
        "--depth",
        type=positive_int,
        help="requests in flight (default and cap: healthy servers x --max-in-flight)",
    )
    p.add_argument("--max-in-flight", type=positive_int, default=1, help="requests per server")
    p.add_argument(
        "--start-timeout",
        type=float,
        default=120.0,
        help="seconds for a reachable but loading server to become ready",
    )
    p.add_argument(
        "--settle-timeout",
        type=float,
        default=60.0,
        help="seconds to wait for every server found to join before measuring",
    )
    p.add_argument(
        "--encoding",
        choices=ENCODING_CHOICES,
        default=AUTO,
        help="supervision encoding; auto: the most compact exact one each server offers",
    )
    p.add_argument(
        "--data-path",
        choices=DATA_PATHS,
        default=AUTO,
        help="wire, p2p (point-to-point; gloo on CPU servers) or auto (GPU-direct when possible)",
    )


def run(args: argparse.Namespace) -> int:
    from .bench import bench, check_reachable
    from .errors import BatchFailedError
    from .options import PoolOptions
    from .probe import endpoint_specs, read_token

    specs, token = endpoint_specs(args.endpoints), read_token(args.auth_token_file)
    check_reachable(specs, args.nameserver, token, args.resolve_timeout)
    options = PoolOptions(
        max_in_flight=args.max_in_flight,
        data_path=args.data_path,
        start_timeout=args.start_timeout,
        encoding=args.encoding,
    )
    try:
        bench(args, token, options)
    except BatchFailedError as exc:
        raise CommandError(str(exc), Exit.FAILED) from None
    return Exit.OK
