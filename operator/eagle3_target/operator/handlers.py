"""kopf wiring: one level-based reconcile for create, resume, update and a timer; an index over target pods.
Importing this module registers the handlers; set EAGLE3_TARGET_OPERATOR_INTERVAL before importing it to
change how often every target is re-checked (heals deleted pods, advances rollouts, refreshes status)."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import kopf
import kr8s.asyncio

from . import GROUP, PLURAL, VERSION, builders
from .kube import Children
from .spec import InvalidSpec, TargetSpec
from .status import PodState, compute_status, plan

INTERVAL = float(os.environ.get("EAGLE3_TARGET_OPERATOR_INTERVAL", "10"))
DEFAULT_IMAGE = "ghcr.io/eagle3-target/eagle3-target:0.1.0"

log = logging.getLogger(__name__)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod: its service account; elsewhere: $KUBECONFIG (read on each login, unlike kubernetes-client)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kopf's bookkeeping lives in annotations under our group, so the status stays exactly our schema
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/kopf-finalizer"
    settings.posting.level = logging.WARNING  # only problems become Events, besides our own
    memo.setdefault("default_image", os.environ.get("EAGLE3_TARGET_IMAGE", DEFAULT_IMAGE))
    memo.locks = {}
    memo.children = Children(await kr8s.asyncio.api(kubeconfig=os.environ.get("KUBECONFIG")))


@kopf.index(
    "pods", labels={"app.kubernetes.io/managed-by": builders.MANAGER, builders.TARGET_LABEL: kopf.PRESENT}
)
def target_pods(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict:
    return {(namespace, labels[builders.TARGET_LABEL]): PodState.from_pod(dict(body))}


def _desired_replicas(spec: dict, pods: list[PodState]) -> int:
    replicas = spec.get("replicas", 1)
    return replicas if isinstance(replicas, int) and replicas >= 0 else len(pods)


async def reconcile(
    *,
    name: str,
    namespace: str,
    spec: kopf.Spec,
    meta: kopf.Meta,
    status: kopf.Status,
    body: kopf.Body,
    patch: kopf.Patch,
    memo: kopf.Memo,
    target_pods: kopf.Index,
    **_: Any,
) -> None:
    lock = memo.locks.setdefault((namespace, name), asyncio.Lock())
    async with lock:  # the timer and the change handlers run concurrently for one object
        pods = list(target_pods.get((namespace, name), []))
        try:
            target = TargetSpec.parse(dict(spec))
            problems = target.problems()
        except InvalidSpec as e:
            target, problems = None, [str(e)]

        hashes: dict[int, str] = {}
        if target is not None and not problems:
            hashes = {
                i: builders.spec_hash(builders.pod_spec(target, name, i, memo.default_image))
                for i in range(target.replicas)
            }
            await _apply(target, name, namespace, body, pods, hashes, memo)

        replicas = target.replicas if target is not None else _desired_replicas(dict(spec), pods)
        previous = dict(status)
        new_status = compute_status(
            name=name,
            pods=pods,
            replicas=replicas,
            hashes=hashes,
            problems=problems,
            generation=meta.get("generation"),
            selector=builders.selector_string(name),
            previous=previous,
        )
        for key, value in new_status.items():
            if previous.get(key) != value:
                patch.status[key] = value
        _announce_invalid(body, previous, problems)


async def _apply(target, name, namespace, body, pods, hashes, memo) -> None:
    for child in builders.children(target, name, namespace):
        kopf.append_owner_reference(child, owner=body)
        if await memo.children.ensure(child) != "unchanged":
            log.info("%s/%s: %s %s", namespace, name, child["kind"], child["metadata"]["name"])
    step = plan(pods, target.replicas, hashes)
    for pod_name in step.delete:
        if await memo.children.delete_pod(pod_name, namespace):
            kopf.event(body, type="Normal", reason="DeletedPod", message=f"deleted pod {pod_name}")
    for ordinal in step.create:
        pod = builders.pod(target, name, namespace, ordinal, memo.default_image)
        kopf.append_owner_reference(pod, owner=body)
        if await memo.children.create_pod(pod):
            kopf.event(
                body, type="Normal", reason="CreatedPod", message=f"created pod {pod['metadata']['name']}"
            )


def _announce_invalid(body: kopf.Body, previous: dict, problems: list[str]) -> None:
    """One Warning event per distinct problem set, not one per timer tick."""
    if not problems:
        return
    message = "; ".join(problems)
    before = next((c for c in previous.get("conditions") or [] if c.get("type") == "Degraded"), {})
    if before.get("reason") != "InvalidSpec" or before.get("message") != message:
        kopf.event(body, type="Warning", reason="InvalidSpec", message=message)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
async def on_change(**kwargs: Any) -> None:
    await reconcile(**kwargs)


@kopf.timer(GROUP, VERSION, PLURAL, interval=INTERVAL, initial_delay=INTERVAL)
async def on_timer(**kwargs: Any) -> None:
    await reconcile(**kwargs)
