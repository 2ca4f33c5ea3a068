"""`eagle3-target probe`: what a trainer pod sees: every server found, its state, model and latency."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from .connection import TRANSIENT_ERRORS, ServerConnection, ServerError
from .dispatch import describe_model
from .endpoints import (
    EndpointError,
    EndpointResolver,
    default_spec,
    default_token,
    make_resolver,
    parse_specs,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("endpoints", nargs="?", help="endpoint spec (default: $EAGLE3_TARGET_SERVICE)")
    p.add_argument("--nameserver", help="DNS server host[:port] (default: the system's)")
    p.add_argument("--auth-token-file", type=Path, help="default: $EAGLE3_TARGET_AUTH_TOKEN_FILE")
    p.add_argument(
        "--resolve-timeout", type=float, default=10.0, help="seconds to wait for the name (default 10)"
    )
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per request (default 5)")
    p.add_argument("--pings", type=int, default=5, help="heartbeat round trips per server (default 5)")
    p.add_argument("--json", action="store_true", help="print one JSON object per server")


async def probe_server(conn: ServerConnection, pings: int) -> dict[str, Any]:
    """Liveness, readiness, model info and heartbeat round-trip latency of one server."""
    report: dict[str, Any] = {"url": conn.url}
    try:
        live_status, _ = await conn.livez()
        report["alive"] = live_status in (200, 404)  # 404: a stock NeMo server, which has no /livez
        health_status, _ = await conn.health()
        report["ready"] = health_status == 200
        if report["ready"]:
            report["model_info"] = await conn.model_info()
            samples = []
            for _ in range(pings):
                start = time.perf_counter()
                await conn.heartbeat()
                samples.append(time.perf_counter() - start)
            report["rtt_ms"] = round(statistics.median(samples) * 1000, 3)
        await conn.disconnect()
    except (ServerError, *TRANSIENT_ERRORS) as exc:
        report.setdefault("alive", False)
        report.setdefault("ready", False)
        report["error"] = f"{type(exc).__name__}: {exc}"
    return report


async def probe(args: argparse.Namespace) -> list[dict[str, Any]]:
    resolver = EndpointResolver(parse_specs(args.endpoints or default_spec()), make_resolver(args.nameserver))
    urls = await resolver.resolve_until(asyncio.get_running_loop().time() + args.resolve_timeout)
    token = args.auth_token_file.read_text().strip() if args.auth_token_file else default_token()
    session_id = f"probe-{uuid.uuid4()}"
    async with aiohttp.ClientSession(trust_env=False) as http:
        conns = [ServerConnection(u, http, session_id, auth_token=token, timeout=args.timeout) for u in urls]
        return list(await asyncio.gather(*(probe_server(c, args.pings) for c in conns)))


def run(args: argparse.Namespace) -> int:
    try:
        reports = asyncio.run(probe(args))
    except EndpointError as exc:
        print(f"error: {exc}")
        return 2
    models = {describe_model(r["model_info"]) for r in reports if "model_info" in r}
    for report in reports:
        if args.json:
            print(json.dumps(report, sort_keys=True))
            continue
        state = "ready" if report["ready"] else "alive, not ready" if report["alive"] else "down"
        line = f"{report['url']:<28} {state:<16}"
        if "model_info" in report:
            info = report["model_info"]
            line += f" rtt {report['rtt_ms']:.2f} ms  {info.get('model', '?')} ({describe_model(info)})"
        if "error" in report:
            line += f" {report['error']}"
        print(line)
    if len(models) > 1:
        print(f"error: the servers disagree on the model: {sorted(models)}")
    print(f"{sum(r['ready'] for r in reports)}/{len(reports)} servers ready")
    return 0 if reports and all(r["ready"] for r in reports) and len(models) == 1 else 1
