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
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    async def one(http: aiohttp.ClientSession, url: str) -> None:
        async with slots:
            if outcome.refused:
                return
            try:
                async with http.post(f"{url}/{contract.REFRESH}", data=body, headers=headers) as resp:
                    reply = await resp.json(content_type=None)
                    if resp.status == 200:
                        outcome.served[url] = reply["version"]
                        return
                    outcome.refused[url] = f"{resp.status} {reply.get('error')}: {reply.get('detail')}"
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, AttributeError) as exc:
                outcome.refused[url] = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
        await asyncio.gather(*(one(http, url) for url in urls))
    return outcome
