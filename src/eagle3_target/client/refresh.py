"""A fleet refreshed to new weights (`eagle3-target refresh`): every replica's POST /weights/refresh, a
bounded number at a time so the others keep serving, and no replica started after one has refused (a bad
checkpoint is not rolled further)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import aiohttp

from eagle3_target.protocol import contract

from .endpoints import EndpointResolver, EndpointSpec, make_resolver

RESOLVE_SECONDS = 10.0


@dataclass
class Outcome:
    served: dict[str, str] = field(default_factory=dict)  # url -> the version it serves now
    refused: dict[str, str] = field(default_factory=dict)  # url -> why, in one line

    def settle(self, url: str, reply: dict, why: str | None) -> None:
        """A replica's answer: the version it serves, or why not."""
        if why is None and isinstance(reply.get("version"), str):
            self.served[url] = reply["version"]
        else:
            self.refused[url] = why or f"200 without a version: {str(reply)[:200]}"


async def replicas(
    urls: list[str] | None, specs: list[EndpointSpec] | None, nameserver: str | None
) -> list[str]:
    """The replicas named, or those the specs resolve to (EndpointError when they resolve to none)."""
    if urls:
        return list(dict.fromkeys(u.rstrip("/") for u in urls))
    resolver = EndpointResolver(specs, make_resolver(nameserver))
    return sorted(await resolver.resolve_until(asyncio.get_running_loop().time() + RESOLVE_SECONDS))


async def refresh_fleet(
    urls: list[str], source: str, version: str, token: str, parallel: int, timeout: float
) -> Outcome:
    outcome, slots = Outcome(), asyncio.Semaphore(parallel)
    body = json.dumps({"source": source, "version": version})

    async def one(http: aiohttp.ClientSession, url: str) -> None:
        async with slots:
            if outcome.refused:
                return
            reply, why = await post_admin(http, f"{url}/{contract.REFRESH}", body, token)
            outcome.settle(url, reply, why)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
        await asyncio.gather(*(one(http, url) for url in urls))
    return outcome


async def post_admin(http: aiohttp.ClientSession, url: str, body: str, token: str) -> tuple[dict, str | None]:
    """(reply, None) for a 200 with a JSON object, else ({}, why in one line)."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    try:
        async with http.post(url, data=body, headers=headers) as resp:
            reply = await resp.json(content_type=None)
            if not isinstance(reply, dict):
                return {}, f"{resp.status}: not a JSON object"
            if resp.status == 200:
                return reply, None
            return {}, f"{resp.status} {reply.get('error')}: {reply.get('detail')}"
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return {}, " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
