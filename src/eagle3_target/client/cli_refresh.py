"""`eagle3-target refresh`: arguments (standard library only, so --help needs no extra) and run()."""

from __future__ import annotations

import argparse
from pathlib import Path

from eagle3_target.exits import CommandError, Exit


def add_arguments(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", nargs="+", help="the replicas, each http://host:port")
    where.add_argument(
        "--service", help="every replica a name resolves to: srv://name or dns://name[:port] (as probe takes)"
    )
    p.add_argument("--nameserver", help="DNS server host[:port] for --service (default: the system's)")
    p.add_argument(
        "--from", dest="source", required=True, help="checkpoint folder (on the servers) or s3:// URI"
    )
    p.add_argument("--version", dest="label", required=True, help="the version the new weights serve under")
    p.add_argument("--admin-token-file", type=Path, required=True, help="the servers' --admin-token-file")
    p.add_argument(
        "--max-parallel", type=int, default=1, help="replicas refreshing at once (the rest keep serving)"
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one replica's refresh may take")


def run(args: argparse.Namespace) -> int:
    import asyncio

    from eagle3_target.protocol.contract import TokenFileError, read_token_file
    from eagle3_target.protocol.model_info import check_target_version

    from .endpoints import EndpointError, parse_specs
    from .refresh import refresh_fleet, replicas

    try:
        label = check_target_version(args.label)
        token = read_token_file(args.admin_token_file)
    except (ValueError, TokenFileError) as exc:
        raise CommandError(
            f"--version {exc}" if isinstance(exc, ValueError) else f"--admin-token-file {exc}", Exit.USAGE
        ) from None
    if args.max_parallel < 1:
        raise CommandError("--max-parallel must be at least 1", Exit.USAGE)
    try:
        specs = parse_specs(args.service) if args.service else None
    except EndpointError as exc:
        raise CommandError(f"--service: {exc}", Exit.USAGE) from None
    try:
        urls = asyncio.run(replicas(args.url, specs, args.nameserver))
    except EndpointError as exc:
        raise CommandError(str(exc), Exit.UNREACHABLE) from None
    outcome = asyncio.run(refresh_fleet(urls, args.source, label, token, args.max_parallel, args.timeout))
    for url, version in outcome.served.items():
        print(f"{url}: {version}")
    if outcome.refused:
        url, why = next(iter(outcome.refused.items()))
        untouched = len(urls) - len(outcome.served) - len(outcome.refused)
        rest = f"; {untouched} not tried" if untouched else ""
        raise CommandError(f"{url} refused the refresh: {why}{rest}", Exit.FAILED)
    return Exit.OK
