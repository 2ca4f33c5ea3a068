"""Brings a target's replicas to `spec.weights` in place: each pass starts the refreshes `weights.to_refresh`
allows as background tasks (a checkpoint load outlasts a reconcile pass), each a `POST /weights/refresh` to one
pod with the admin token; the answer is recorded on the pod (annotations, and the readiness gate that lets a new
pod join the endpoints), never by replacing it."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import aiohttp
import kopf

from .weights import (
    ADMIN_KEY,
    READINESS_GATE,
    RESTARTS_ANNOTATION,
    VERSION_ANNOTATION,
    Weights,
    admin_secret,
    to_refresh,
)

REFRESH_PATH = "/weights/refresh"
RETRY_SECONDS = 60.0  # a refused refresh is asked again after this long (or at once on a new spec.weights)
DETAIL_CHARS = 300

log = logging.getLogger(__name__)


class RefreshError(Exception):
    """One replica did not refresh; the message names its URL and what it answered."""


@dataclass
class Refreshes:
    """One target's refreshes: the admin token, those under way, and those refused (pod -> (version, retry
    after, message))."""

    token: str = ""
    busy: dict[str, asyncio.Task] = field(default_factory=dict)
    failed: dict[str, tuple[str, float, str]] = field(default_factory=dict)

    def observed(self, target) -> dict[str, str]:
        """status.Observed's weights fields: the wanted version, and the refusals of it."""
        if target is None or target.weights is None:
            return {}
        version = target.weights.version
        errors = "; ".join(m for v, _, m in self.failed.values() if v == version)
        return {"weights_version": version, "refresh_errors": errors}


def address(pod) -> str:
    host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
    return f"{host}:{pod.http_port}"


async def refresh_replica(url: str, token: str, weights: Weights, timeout: float) -> str:
    """POST `weights` to one replica's refresh endpoint; its answered version, or RefreshError."""
    headers = {"Authorization": f"Bearer {token}"}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.post(url, json=weights.body(), headers=headers) as response,
        ):
            text = await response.text()
            if response.status != 200:
                raise RefreshError(f"{url}: HTTP {response.status}: {text[:DETAIL_CHARS]}")
            version = json.loads(text).get("version")
    except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError) as e:
        raise RefreshError(f"{url}: {type(e).__name__}: {str(e)[:DETAIL_CHARS]}") from None
    if version != weights.version:
        raise RefreshError(f"{url} answered version {version!r}, not {weights.version!r}")
    return version


async def ensure_token(refreshes: Refreshes, body: dict, children, labels: dict) -> None:
    """The admin token Secret exists before any pod that mounts it; its value is read once."""
    if refreshes.token:
        return
    secret = admin_secret(body["metadata"]["name"], body["metadata"]["namespace"], labels)
    kopf.append_owner_reference(secret, owner=body)
    refreshes.token = await children.secret_value(secret, ADMIN_KEY)


def start(refreshes: Refreshes, target, pods, body: dict, children, now: float | None = None) -> list[str]:
    """Start this pass's refreshes, at most max(maxUnavailable, 1) at once; returns the pods started."""
    if target.weights is None or not refreshes.token:
        return []
    now = time.time() if now is None else now
    version = target.weights.version
    refreshes.busy = {n: t for n, t in refreshes.busy.items() if not t.done()}
    resting = {n for n, (v, after, _) in refreshes.failed.items() if v == version and after > now}
    budget = max(target.surge_and_unavailable()[1], 1)
    chosen = to_refresh(pods, version, target.replicas, budget, set(refreshes.busy), resting)
    timeout = float(target.progress_deadline_seconds)
    for pod in chosen:
        task = asyncio.create_task(_refresh(refreshes, pod, target.weights, body, children, timeout))
        refreshes.busy[pod.name] = task
    return [p.name for p in chosen]


async def _refresh(refreshes: Refreshes, pod, weights: Weights, body: dict, children, timeout: float) -> None:
    namespace = body["metadata"]["namespace"]
    gate_was_open = pod.gated and pod.ready
    try:
        if gate_was_open:  # out of the endpoints while it changes version: it counts against maxUnavailable
            await children.patch_pod(pod.name, namespace, {}, (READINESS_GATE, False))
        url = f"http://{address(pod)}{REFRESH_PATH}"
        version = await refresh_replica(url, refreshes.token, weights, timeout)
        annotations = {VERSION_ANNOTATION: version, RESTARTS_ANNOTATION: str(pod.restarts)}
        await children.patch_pod(
            pod.name, namespace, annotations, (READINESS_GATE, True) if pod.gated else None
        )
        refreshes.failed.pop(pod.name, None)
        log.info("%s: pod %s serves weights %s", body["metadata"]["name"], pod.name, version)
    except RefreshError as e:
        refreshes.failed[pod.name] = (weights.version, time.time() + RETRY_SECONDS, f"{pod.name}: {e}")
        if gate_was_open:  # it still serves its former weights, whole
            await children.patch_pod(pod.name, namespace, {}, (READINESS_GATE, True))
        await children.post_event(body, "Warning", "RefreshFailed", f"{pod.name}: {e}")
    except Exception:  # an API error: the next pass tries again
        log.exception("refresh of pod %s failed", pod.name)
