"""`eagle3-target probe`: what a trainer pod sees: every server found, its state, model and latency."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from eagle3_target.protocol.model_info import ModelInfo

from .connection import TRANSIENT_ERRORS, ServerConnection, ServerError
from .endpoints import (
    EndpointError,
    EndpointResolver,
    default_spec,
    make_resolver,
    parse_specs,
    read_auth_token,
)

# Exit codes (docs/client.md): the worst state found decides.
EXIT_OK, EXIT_NOT_READY, EXIT_USAGE, EXIT_UNAUTHORIZED = 0, 1, 2, 3
STATES = ("ready", "loading", "unauthorized", "down")  # what one server is, to this caller


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("endpoints", nargs="?", help="endpoint spec (default: $EAGLE3_TARGET_SERVICE)")
    p.add_argument("--nameserver", help="DNS server host[:port] (default: the system's)")
    p.add_argument("--auth-token-file", type=Path, help="default: $EAGLE3_TARGET_AUTH_TOKEN_FILE")
    p.add_argument(
        "--resolve-timeout", type=float, default=10.0, help="seconds to wait for the name (default 10)"
    )
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per request (default 5)")
    p.add_argument("--pings", type=int, default=5, help="heartbeat round trips per server (default 5)")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout (servers, summary)")


async def probe_server(conn: ServerConnection, pings: int) -> dict[str, Any]:
    """State, model info and heartbeat round-trip latency of one server, as our session sees it."""
    report: dict[str, Any] = {"url": conn.url, "state": "down"}
    try:
        live_status, _ = await conn.livez()
        report["state"] = "loading"  # it answers; 404 is a stock NeMo server, which has no /livez
        health_status, _ = await conn.health()
        if health_status == 200:
            report["model_info"] = (await conn.model_info()).to_json()  # the first call that needs our token
            samples = []
            for _ in range(max(1, pings)):
                start = time.perf_counter()
                await conn.heartbeat()
                samples.append(time.perf_counter() - start)
            report["rtt_ms"] = round(statistics.median(samples) * 1000, 3)
            report["state"] = "ready"
        await conn.disconnect()
    except ServerError as exc:
        report["state"] = "unauthorized" if exc.status in (401, 403) else report["state"]
        report["error"] = f"HTTP {exc.status} {exc.error}: {exc.detail}"
    except TRANSIENT_ERRORS as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
    return report


async def probe(
    endpoints: str | None,
    *,
    nameserver: str | None = None,
    token: str | None = None,
    resolve_timeout: float = 10.0,
    timeout: float = 5.0,
    pings: int = 1,
) -> list[dict[str, Any]]:
    """Resolve the spec once (retrying until ``resolve_timeout``) and probe every server found at once."""
    resolver = EndpointResolver(parse_specs(endpoints or default_spec()), make_resolver(nameserver))
    urls = await resolver.resolve_until(asyncio.get_running_loop().time() + resolve_timeout)
    session_id = f"probe-{uuid.uuid4()}"
    async with aiohttp.ClientSession(trust_env=False) as http:
        conns = [ServerConnection(u, http, session_id, auth_token=token, timeout=timeout) for u in urls]
        return list(await asyncio.gather(*(probe_server(c, pings) for c in conns)))


def read_token(path: Path | None) -> str | None:
    return read_auth_token(path)


def summarize(reports: list[dict[str, Any]]) -> dict[str, Any]:
    models = sorted({ModelInfo.from_json(r["model_info"]).describe() for r in reports if "model_info" in r})
    ready = sum(r["state"] == "ready" for r in reports)
    if any(r["state"] == "unauthorized" for r in reports):
        code = EXIT_UNAUTHORIZED
    elif reports and ready == len(reports) and len(models) == 1:
        code = EXIT_OK
    else:
        code = EXIT_NOT_READY
    return {"ready": ready, "total": len(reports), "models": models, "exit_code": code}


def describe(report: dict[str, Any]) -> str:
    line = f"{report['url']:<28} {report['state']:<13}"
    if "model_info" in report:
        info = report["model_info"]
        line += f" rtt {report['rtt_ms']:.2f} ms  {info.get('model', '?')} ({ModelInfo.from_json(info).describe()})"
    if "error" in report:
        line += f" {report['error']}"
    return line


def run(args: argparse.Namespace) -> int:
    try:
        reports = asyncio.run(
            probe(
                args.endpoints,
                nameserver=args.nameserver,
                token=read_token(args.auth_token_file),
                resolve_timeout=args.resolve_timeout,
                timeout=args.timeout,
                pings=args.pings,
            )
        )
    except EndpointError as exc:
        print(f"eagle3-target probe: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
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
