"""What a trainer pod sees: every server found, its state, model and latency (`eagle3-target probe`)."""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from eagle3_target.exits import CommandError, Exit
from eagle3_target.protocol.model_info import ModelInfo, ModelInfoError

from .connection import TRANSIENT_ERRORS, ServerConnection, ServerError
from .endpoints import (
    EndpointError,
    EndpointResolver,
    EndpointSpec,
    default_spec,
    make_resolver,
    parse_specs,
    read_auth_token,
)
from .limits import new_session
from .members import short

STATES = ("ready", "loading", "unauthorized", "down")  # what one server is, to this caller


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
    except (*TRANSIENT_ERRORS, ModelInfoError) as exc:
        report["error"] = short(exc)  # aiohttp's own words name ssl:default even for http://
    return report


async def probe(
    specs: list[EndpointSpec],
    *,
    nameserver: str | None = None,
    token: str | None = None,
    resolve_timeout: float = 10.0,
    timeout: float = 5.0,
    pings: int = 1,
) -> list[dict[str, Any]]:
    """Resolve the specs once (retrying until ``resolve_timeout``) and probe every server found at once."""
    resolver = EndpointResolver(specs, make_resolver(nameserver))
    urls = await resolver.resolve_until(asyncio.get_running_loop().time() + resolve_timeout)
    session_id = f"probe-{uuid.uuid4()}"
    async with new_session() as http:
        conns = [ServerConnection(u, http, session_id, auth_token=token, timeout=timeout) for u in urls]
        return list(await asyncio.gather(*(probe_server(c, pings) for c in conns)))


def read_token(path: Path | None) -> str | None:
    """The token in ``path``, else $EAGLE3_TARGET_AUTH_TOKEN_FILE's; an unreadable file is a usage error."""
    try:
        return read_auth_token(path)
    except EndpointError as exc:
        raise CommandError(str(exc), Exit.USAGE) from None


def endpoint_specs(text: str | None) -> list[EndpointSpec]:
    """The spec given, else $EAGLE3_TARGET_SERVICE's; a bad one is a usage error."""
    try:
        return parse_specs(text or default_spec())
    except EndpointError as exc:
        raise CommandError(str(exc), Exit.USAGE) from None


def summarize(reports: list[dict[str, Any]]) -> dict[str, Any]:
    models = sorted({ModelInfo.from_json(r["model_info"]).describe() for r in reports if "model_info" in r})
    ready = sum(r["state"] == "ready" for r in reports)
    if any(r["state"] == "unauthorized" for r in reports):
        code = Exit.UNAUTHORIZED
    elif not any(r["state"] != "down" for r in reports):
        code = Exit.UNREACHABLE
    elif ready == len(reports) and len(models) == 1:
        code = Exit.OK
    else:
        code = Exit.FAILED
    return {"ready": ready, "total": len(reports), "models": models, "exit_code": code}


def describe(report: dict[str, Any]) -> str:
    line = f"{report['url']:<28} {report['state']:<13}"
    if "model_info" in report:
        info = report["model_info"]
        line += f" rtt {report['rtt_ms']:.2f} ms  {info.get('model', '?')} ({ModelInfo.from_json(info).describe()})"
    if "error" in report:
        line += f" {report['error']}"
    return line
