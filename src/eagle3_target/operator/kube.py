"""The few writes the operator makes, through kr8s (async, plain dicts): create-or-patch for Services and
ConfigMaps, create and delete for pods, a target's status, finalizers and Events; and the one read outside its
watches, whether a namespace is being deleted. A create that finds the object already there (409) and a delete
that finds it gone (404) are reported, not raised; any other API error is raised to the caller."""

from __future__ import annotations

import base64
import datetime
import json
from typing import Any

import kr8s
import kr8s.asyncio
from kr8s.asyncio.objects import (
    ConfigMap,
    Event,
    Namespace,
    Pod,
    PodDisruptionBudget,
    Secret,
    Service,
    new_class,
)

from . import GROUP, KIND, PLURAL, VERSION
from .disruption import switch_bound

Target = new_class(KIND, f"{GROUP}/{VERSION}", namespaced=True, plural=PLURAL)
KINDS = {
    "Pod": Pod,
    "Service": Service,
    "ConfigMap": ConfigMap,
    "PodDisruptionBudget": PodDisruptionBudget,
    "Secret": Secret,
}


def is_subset(desired: Any, actual: Any) -> bool:
    """True if every field we set has our value; fields the API server filled in are ignored."""
    if isinstance(desired, dict):
        return isinstance(actual, dict) and all(
            k in actual and is_subset(v, actual[k]) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(actual, list) and len(desired) == len(actual) and all(map(is_subset, desired, actual))
        )
    return desired == actual


def _status_code(error: kr8s.ServerError) -> int | None:
    return error.response.status_code if error.response is not None else None


async def served(api: kr8s.asyncio.Api) -> bool:
    """Whether the API server serves our resource (one discovery request, which every identity may make)."""
    try:
        async with api.call_api("GET", version="", base="/apis", url=f"{GROUP}/{VERSION}") as response:
            return any(r["name"] == PLURAL for r in response.json()["resources"])
    except kr8s.ServerError as e:
        if e.response is not None and e.response.status_code == 404:
            return False
        raise


class Children:
    def __init__(self, api: kr8s.asyncio.Api) -> None:
        self.api = api

    def _object(self, body: dict):
        return KINDS[body["kind"]](body, api=self.api)

    async def ensure(self, body: dict, seen: dict | None) -> str:
        """Create the object, or patch it back to `body` where it drifted from `seen` (the object as the
        operator's watch last saw it, None if absent: no read of its own); returns what was done."""
        if seen is None:
            try:
                await self._object(body).create()
            except kr8s.ServerError as e:
                if _status_code(e) != 409:  # 409: created meanwhile, e.g. by a concurrent reconcile
                    raise
            return "created"
        if is_subset(body, seen):
            return "unchanged"
        current = self._object({"kind": body["kind"], "metadata": dict(body["metadata"])})
        patch = switch_bound(body) if body["kind"] == "PodDisruptionBudget" else body
        await current.patch({k: v for k, v in patch.items() if k not in ("apiVersion", "kind")})
        return "patched"

    async def remove(self, kind: str, name: str, namespace: str) -> bool:
        try:
            await self._object({"kind": kind, "metadata": {"name": name, "namespace": namespace}}).delete()
        except kr8s.NotFoundError:
            return False
        return True

    async def create_pod(self, body: dict) -> dict | None:
        """The created pod, or None if one of that name exists; other refusals (403 from admission, 422)
        raise kr8s.ServerError, whose message is the API server's."""
        pod = self._object(body)
        try:
            await pod.create()
        except kr8s.ServerError as e:
            if _status_code(e) == 409:  # still there (e.g. terminating): the next pass tries again
                return None
            raise
        return pod.raw

    async def delete_pod(self, name: str, namespace: str, *, force: bool = False) -> bool:
        """`force`: grace period 0, gone from the API at once without the kubelet's confirmation."""
        try:
            await Pod({"metadata": {"name": name, "namespace": namespace}}, api=self.api).delete(force=force)
        except kr8s.NotFoundError:
            return False
        return True

    async def mount_failure(self, pod: str, namespace: str) -> str | None:
        """The kubelet's last FailedMount message for `pod` ('MountVolume.SetUp failed for volume "x" : secret
        "y" not found'), or None: a missing Secret or ConfigMap shows nowhere else."""
        selector = f"involvedObject.kind=Pod,involvedObject.name={pod},reason=FailedMount"
        events = [e async for e in self.api.get("events", namespace=namespace, field_selector=selector)]
        events.sort(key=lambda e: e.raw.get("lastTimestamp") or e.raw.get("eventTime") or "")
        return events[-1].raw.get("message") if events else None

    async def namespace_terminating(self, namespace: str) -> bool:
        """Whether `namespace` is being deleted: the API server refuses anything created in it (403). A
        namespace already gone took its targets with it (their DELETED events follow)."""
        current = Namespace({"metadata": {"name": namespace}}, api=self.api)
        try:
            await current.refresh()
        except kr8s.NotFoundError:
            return False
        return bool(current.raw["metadata"].get("deletionTimestamp"))

    async def secret_value(self, body: dict, key: str) -> str:
        """`key` of the Secret named like `body`, created from `body` if absent (a 409 means a concurrent
        create won: its value is read back)."""
        meta = body["metadata"]
        try:
            await self._object(body).create()
        except kr8s.ServerError as e:
            if _status_code(e) != 409:
                raise
        # a GET by name: kr8s' Secret.get lists with a field selector, which `get` alone does not allow
        url = f"secrets/{meta['name']}"
        async with self.api.call_api("GET", url=url, namespace=meta["namespace"]) as response:
            return base64.b64decode(response.json()["data"][key]).decode()

    async def patch_pod(self, name: str, namespace: str, annotations: dict, gate: tuple[str, bool] | None):
        """Annotations (metadata only: the pod keeps running), then a readiness gate's condition through
        /status, merged by type (strategic merge) so the kubelet's own conditions stay."""
        await Pod({"metadata": {"name": name, "namespace": namespace}}, api=self.api).patch(
            {"metadata": {"annotations": annotations}}
        )
        if gate is not None:
            condition = {"type": gate[0], "status": "True" if gate[1] else "False"}
            condition["lastTransitionTime"] = datetime.datetime.now(datetime.UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            )
            body = json.dumps({"status": {"conditions": [condition]}})
            headers = {"Content-Type": "application/strategic-merge-patch+json"}
            url = f"pods/{name}/status"
            async with self.api.call_api(
                "PATCH", url=url, namespace=namespace, content=body, headers=headers
            ):
                pass

    async def patch_status(self, name: str, namespace: str, status: dict) -> dict:
        target = Target({"metadata": {"name": name, "namespace": namespace}}, api=self.api)
        await target.patch({"status": status}, subresource="status")
        return target.raw

    async def drop_finalizer(self, name: str, namespace: str, finalizers: list[str], finalizer: str) -> None:
        """Remove one finalizer; the `test` makes it fail (422) rather than drop someone else's added meanwhile."""
        target = Target({"metadata": {"name": name, "namespace": namespace}}, api=self.api)
        patch = [
            {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
            {
                "op": "replace",
                "path": "/metadata/finalizers",
                "value": [f for f in finalizers if f != finalizer],
            },
        ]
        await target.patch(patch, type="json")

    async def post_event(self, body: dict, type_: str, reason: str, message: str) -> None:
        """A core/v1 Event on the target (what `kubectl describe e3t` shows)."""
        meta = body["metadata"]
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": body["apiVersion"],
                "kind": body["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "eagle3-target-operator"},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        await Event(event, api=self.api).create()
