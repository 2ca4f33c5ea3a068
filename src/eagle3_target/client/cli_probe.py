"""`eagle3-target probe`: arguments (standard library only, so --help needs no extra) and run()."""

from __future__ import annotations

import argparse
from pathlib import Path

from eagle3_target.exits import CommandError, Exit


def add_endpoint_arguments(p: argparse.ArgumentParser) -> None:
    """Where the servers are and how to authenticate: shared by probe and bench."""
    p.add_argument(
        "endpoints",
        nargs="?",
        help="comma-separated http://host:port, dns://name[:port] or srv://name (default: $EAGLE3_TARGET_SERVICE)",
    )
    p.add_argument("--nameserver", help="DNS server host[:port] (default: the system's)")
    p.add_argument(
        "--auth-token-file", type=Path, help="bearer token file (default: $EAGLE3_TARGET_AUTH_TOKEN_FILE)"
    )
    p.add_argument(
        "--resolve-timeout", type=float, default=10.0, help="seconds to wait for the name to resolve"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_endpoint_arguments(p)
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per request")
    p.add_argument("--pings", type=int, default=5, help="heartbeat round trips per server")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document on stdout (servers, summary; default: a table)",
    )


def run(args: argparse.Namespace) -> int:
    from .temp_dir import require_temp_dir

    require_temp_dir()  # before torch's import, which needs one
    import asyncio
    import json

    from .endpoints import EndpointError
    from .probe import describe, endpoint_specs, probe, read_token, summarize

    specs, token = endpoint_specs(args.endpoints), read_token(args.auth_token_file)
    try:
        reports = asyncio.run(
            probe(
                specs,
                nameserver=args.nameserver,
                token=token,
                resolve_timeout=args.resolve_timeout,
                timeout=args.timeout,
                pings=args.pings,
            )
        )
    except EndpointError as exc:  # the name did not resolve in time
        raise CommandError(str(exc), Exit.UNREACHABLE) from None
    summary = summarize(reports)
    if args.json:
        print(json.dumps({"servers": reports, **summary}, sort_keys=True))
        return summary["exit_code"]
    for report in reports:
        print(describe(report))
    if len(summary["models"]) > 1:
        print(f"the servers disagree on the model: {summary['models']}")
    print(f"{summary['ready']}/{summary['total']} servers ready")
    return summary["exit_code"]
