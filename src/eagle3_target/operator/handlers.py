"""kopf wiring: events of targets and of their pods (watched through a label selector) drive one level-based
reconcile; a resync loop re-checks every target each `interval`. No handler needs a finalizer: deleting a
target never waits for the operator, the garbage collector follows the children's owner references. Only
the leader (a coordination.k8s.io Lease) writes anything. Importing this module registers the handlers; the
settings arrive in kopf's memo (`memo.config`, an OperatorConfig) at startup."""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import time
from typing import Any

import kopf
import kr8s
import kr8s.asyncio

from . import GROUP, PLURAL, VERSION, builders, discovery, groups, incluster, refresh
from .announce import announce
from .config import OperatorConfig
from .disruption import drains_blocked
from .group_planner import counted_states, plan_groups
from .kube import Children, served
from .leader import AlwaysLeader, LeaseElector
from .nodes import NodeHealth, lost_pods
from .planner import PodState, Rollout, plan
from .status import Observed, compute_status
from .target_spec import InvalidSpec, TargetSpec
from .tracked import MOUNT_GRACE, Tracked  # noqa: F401 (MOUNT_GRACE: part of this module's interface)

LEGACY_FINALIZER = f"{GROUP}/kopf-finalizer"  # earlier versions' timers needed one; remove it where found
POD_LABELS = {"app.kubernetes.io/managed-by": builders.MANAGER, builders.TARGET_LABEL: kopf.PRESENT}
MANAGED = f"app.kubernetes.io/managed-by={builders.MANAGER}"
# the once-per-target children, read from the operator's own watches instead of a GET each pass
CHILD_KINDS = {
    "Service": ("v1", "services"),
    "ConfigMap": ("v1", "configmaps"),
    "PodDisruptionBudget": ("policy/v1", "poddisruptionbudgets"),
}

log = logging.getLogger(__name__)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod: its service account; elsewhere: $KUBECONFIG (read on each login, unlike kubernetes-client)."""
    return incluster.login(**kwargs)


@kopf.on.startup()
async def configure(
    settings: kopf.OperatorSettings,
    memo: kopf.Memo,
    target_pods: kopf.Index,
    node_health: kopf.Index,
    child_services: kopf.Index,
    child_configmaps: kopf.Index,
    child_budgets: kopf.Index,
    **_: Any,
) -> None:
    config = memo.setdefault("config", OperatorConfig())
    settings.posting.level = logging.WARNING  # only problems become Events, besides our own
    # No cluster-wide watch of CRDs and namespaces (least privilege): the resources are looked up once at
    # startup (install the CRD first, as helm and the manifests do) and -n takes exact namespace names.
    settings.scanning.disabled = True
    # list and watch only the operator's pods, not every pod of the cluster
    for version, plural in [("v1", "pods"), *CHILD_KINDS.values()]:
        settings.watching.label_selectors[version, plural] = MANAGED
    api = await kr8s.asyncio.api(kubeconfig=os.environ.get("KUBECONFIG"))
    # without scanning kopf would idle forever on a resource missing at startup: exit instead, so that the
    # Deployment's restarts pick the CRD up once it is installed
    if not await served(api):
        raise kopf.PermanentError(f"{PLURAL}.{GROUP}/{VERSION} is not served: install the CRD first")
    memo.children = Children(api)
    memo.node_index = node_health  # read by every reconcile, whichever handler runs it
    memo.child_indexes = {
        "Service": child_services,
        "ConfigMap": child_configmaps,
        "PodDisruptionBudget": child_budgets,
    }
    memo.targets = {}
    memo.leader = (
        LeaseElector(api, config, config.lease_namespace or incluster.own_namespace(api.namespace))
        if config.leader_election
        else AlwaysLeader()
    )
    memo.tasks = [asyncio.create_task(memo.leader.run()), asyncio.create_task(_resync(memo, target_pods))]


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    for task in memo.tasks:
        task.cancel()
    await asyncio.gather(*memo.tasks, return_exceptions=True)
    await memo.leader.release()


@kopf.index("pods", labels=POD_LABELS)
def target_pods(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict:
    return {(namespace, labels[builders.TARGET_LABEL]): PodState.from_pod(dict(body))}


def _child(namespace: str, name: str, body: kopf.Body) -> dict:
    return {(namespace, name): dict(body)}


@kopf.index("services", labels=POD_LABELS)
def child_services(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict:
    return _child(namespace, name, body)


@kopf.index("configmaps", labels=POD_LABELS)
def child_configmaps(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict:
    return _child(namespace, name, body)


@kopf.index("policy", "v1", "poddisruptionbudgets", labels=POD_LABELS)
def child_budgets(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict:
    return _child(namespace, name, body)


@kopf.index("nodes")
def node_health(name: str, body: kopf.Body, **_: Any) -> dict:
    return {name: NodeHealth.from_node(dict(body))}


@kopf.on.event("nodes")
async def on_node(body: kopf.Body, memo: kopf.Memo, target_pods: kopf.Index, **_: Any) -> None:
    """A node that stops reporting moves the targets with pods on it on at once (the resync catches the
    moment each pod's toleration runs out)."""
    if NodeHealth.from_node(dict(body)).ready:
        return
    node = body.metadata.name
    for (namespace, name), tracked in list(memo.targets.items()):
        if any(p.node == node for p in target_pods.get((namespace, name), [])):
            await reconcile(tracked, memo, target_pods, full=False)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def on_target(event: dict, body: kopf.Body, memo: kopf.Memo, target_pods: kopf.Index, **_: Any) -> None:
    key = (body.metadata.namespace, body.metadata.name)
    if event.get("type") == "DELETED":
        memo.targets.pop(key, None)  # its lock and expectations go with it
        return
    if (tracked := memo.targets.setdefault(key, Tracked(body={}))).wrote(dict(body)):
        return  # the echo of this operator's own status write: the pass that wrote it saw this state
    tracked.body = copy.deepcopy(dict(body))
    await reconcile(tracked, memo, target_pods, full=True)


@kopf.on.event("pods", labels=POD_LABELS)
async def on_pod(namespace: str, labels: dict, memo: kopf.Memo, target_pods: kopf.Index, **_: Any) -> None:
    """A pod's readiness, phase or deletion moves its target on at once (children: its events, the resync)."""
    tracked = memo.targets.get((namespace, labels[builders.TARGET_LABEL]))
    if tracked is not None and not tracked.pass_waiting:
        tracked.pass_waiting = True
        await reconcile(tracked, memo, target_pods, full=False)


async def _resync(memo: kopf.Memo, index: kopf.Index) -> None:
    """Heal what no event announces (a deleted Service, an expired stuck-pod grace, a passed deadline)."""
    while True:
        await asyncio.sleep(memo.config.interval)
        for tracked in list(memo.targets.values()):
            try:
                await reconcile(tracked, memo, index, full=True)
            except Exception:  # one target's failure must not stop the others' resyncs
                log.exception("resync of %s failed", tracked.body.get("metadata", {}).get("name"))


def _desired_replicas(spec: dict, pods: list[PodState]) -> int:
    replicas = spec.get("replicas", 1)
    return replicas if isinstance(replicas, int) and replicas >= 0 else len(pods)


async def reconcile(tracked: Tracked, memo: kopf.Memo, index: kopf.Index, *, full: bool) -> None:
    async with tracked.lock:  # events and the resync run concurrently for one target
        tracked.pass_waiting = False  # from here on, this pass reads every pod event so far from the index
        if not memo.leader.is_leader:
            return
        body = tracked.body
        meta, spec, previous = body["metadata"], body.get("spec") or {}, dict(body.get("status") or {})
        name, namespace = meta["name"], meta["namespace"]
        if meta.get("deletionTimestamp"):
            return  # the garbage collector removes the children
        if LEGACY_FINALIZER in (meta.get("finalizers") or []):
            await memo.children.drop_finalizer(name, namespace, meta["finalizers"], LEGACY_FINALIZER)
        now = time.time()
        try:
            target = TargetSpec.parse(dict(spec))
            problems = builders.name_problems(name) + target.problems()
        except InvalidSpec as e:
            target, problems = None, [str(e)]

        pods = tracked.observe(list(index.get((namespace, name), [])), now)
        if full:
            await tracked.read_mounts(pods, memo.children, namespace, now)
        lost = lost_pods(pods, _nodes(memo), now)
        rollout, image, create_errors = Rollout(_desired_replicas(spec, pods), ""), "", []
        if target is not None and not problems:
            rollout, image = _rollout(target, previous, memo.config.image)
            create_errors = await _apply(target, tracked, pods, rollout, image, memo, full, now, lost)
            pods = tracked.observe(list(index.get((namespace, name), [])), now)
            refresh.start(tracked.refreshes, target, pods, body, memo.children, now)
        pods = counted_states(
            target, tracked, tracked.with_mounts([p for p in pods if p.name not in lost]), now
        )

        observed = Observed(
            rollout=rollout,
            problems=problems,
            create_errors=create_errors,
            progress_deadline=target.progress_deadline_seconds if target else 1800,
            generation=meta.get("generation"),
            drains_blocked=drains_blocked(target),
            given_back="; ".join(why for _, why in tracked.held.values()),
            **tracked.refreshes.observed(target),
        )
        status = compute_status(
            name=name,
            pods=pods,
            observed=observed,
            selector=builders.selector_string(name, target),
            previous=previous,
            image=image,
            at=now,
        )
        changed = {key: value for key, value in status.items() if previous.get(key) != value}
        if changed:
            try:
                tracked.body = await memo.children.patch_status(name, namespace, changed)
            except kr8s.NotFoundError:
                return  # deleted meanwhile; its DELETED event drops it
        await announce(memo.children, body, previous, status)


def _rollout(target: TargetSpec, previous: dict, default_image: str) -> tuple[Rollout, str]:
    revision = builders.revision(target)
    # the image resolves once per revision: a new operator default waits for the next spec change
    same = previous.get("revision") == revision and previous.get("image")
    image = previous["image"] if same else target.image or default_image
    surge, unavailable = target.surge_and_unavailable()
    return Rollout(target.replicas, revision, surge, unavailable, target.partition), image


def _nodes(memo: kopf.Memo) -> dict[str, NodeHealth]:
    """The node index as {name: health} (kopf stores each key's values as a collection of one)."""
    index = memo.get("node_index")
    return {node: next(iter(values)) for node, values in index.items()} if index is not None else {}


def _seen(memo: kopf.Memo, kind: str, namespace: str, name: str) -> dict | None:
    found = memo.child_indexes[kind].get((namespace, name))
    return next(iter(found)) if found else None


async def _children(target, body: dict, memo: kopf.Memo) -> None:
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    for child in discovery.children(target, name, namespace, memo.config.cluster_domain):
        kopf.append_owner_reference(child, owner=body)
        seen = _seen(memo, child["kind"], namespace, child["metadata"]["name"])
        if await memo.children.ensure(child, seen) != "unchanged":
            log.info("%s/%s: %s %s", namespace, name, child["kind"], child["metadata"]["name"])
    budget = _seen(memo, "PodDisruptionBudget", namespace, name)
    if not target.disruption.enabled and budget is not None:
        await memo.children.remove("PodDisruptionBudget", name, namespace)
        log.info("%s/%s: PodDisruptionBudget removed (spec.disruption.enabled is false)", namespace, name)


def _creates(target, body: dict, memo: kopf.Memo, step) -> bool:
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    children = discovery.children(target, name, namespace, memo.config.cluster_domain)
    return bool(step.create) or any(
        _seen(memo, c["kind"], namespace, c["metadata"]["name"]) is None for c in children
    )


async def _apply(target, tracked, pods, rollout, image, memo, full, now, lost) -> list[str]:
    """Children, then this pass's pod deletions and creations; returns the creations the API refused."""
    body = tracked.body
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    step = _step(target, tracked, pods, rollout, memo, now, lost)
    creates = _creates(target, body, memo, step) or not tracked.refreshes.token  # the admin Secret
    if creates and await memo.children.namespace_terminating(namespace):
        return []  # the API server refuses creations there; the namespace controller removes the rest
    await refresh.ensure_token(tracked.refreshes, body, memo.children, builders.labels(name, "admin"))
    if full:
        await _children(target, body, memo)
    for pod_name in sorted(lost):
        # the kubelet that would confirm a graceful deletion is gone: remove the pod now, so that its
        # replacement can start on a Ready node
        if await memo.children.delete_pod(pod_name, namespace, force=True):
            message = f"pod {pod_name} outlived its toleration on a node that stopped reporting: deleted"
            await memo.children.post_event(body, "Warning", "NodeLost", message)
    for pod_name in step.delete:
        if await memo.children.delete_pod(pod_name, namespace):
            tracked.deleted[pod_name] = now
            await memo.children.post_event(body, "Normal", "DeletedPod", f"deleted pod {pod_name}")
    errors = []
    for ordinal, replica in step.create:  # a group's pods are created together, leader first
        for rank in range(target.nodes_per_replica):
            pod = builders.pod(
                target, name, namespace, ordinal, image, replica, rank, memo.config.cluster_domain
            )
            pod_name = pod["metadata"]["name"]
            kopf.append_owner_reference(pod, owner=body)
            try:
                created = await memo.children.create_pod(pod)
            except kr8s.ServerError as e:  # e.g. 403 from Pod Security admission, 422: the others go on
                errors.append(f"pod {pod_name}: {e}")
                continue
            if created is not None:
                tracked.created[pod_name] = (PodState.from_pod(created), now)
                await memo.children.post_event(body, "Normal", "CreatedPod", f"created pod {pod_name}")
    return errors


def _step(target: TargetSpec, tracked: Tracked, pods, rollout: Rollout, memo: kopf.Memo, now: float, lost):
    """This pass's plan: over pods, or over groups (which may give a group's pods back)."""
    name, grace = tracked.body["metadata"]["name"], memo.config.stuck_pod_grace
    spans = groups.spans_nodes(target)
    tracked.held = {o: h for o, h in tracked.held.items() if h[0] > now and spans}
    if not spans:
        return plan(name, pods, rollout, now, grace, lost)
    held = {o: h[0] for o, h in tracked.held.items()}
    timeout = target.group_schedule_timeout_seconds
    grouped = plan_groups(
        name,
        pods,
        rollout,
        target.nodes_per_replica,
        now=now,
        grace=grace,
        lost=lost,
        timeout=timeout,
        held=held,
    )
    tracked.held.update(grouped.given_back)
    for _, why in grouped.given_back.values():
        log.warning("%s: %s; pods given back", name, why)
    return grouped.plan
