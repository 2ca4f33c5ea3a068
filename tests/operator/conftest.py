"""The real operator (kopf + kr8s) against kmock's Kubernetes emulator, made realistic enough for kopf.

kmock keeps objects as plain dicts; the subclass below adds what kopf relies on: uid, resourceVersion,
generation and timestamps on stored objects, JSON-patch with 422 on a failed `test`, 409 on a patch whose
metadata.resourceVersion is stale (optimistic concurrency, what leader election relies on), a real list
resourceVersion, and watch streams without events the client already saw. kmock does no garbage collection,
ignores label selectors and applies /status patches to the whole object; the operator copes with all three.
Every write to a pod is followed by a snapshot of (pods, ready pods), so tests can assert bounds that hold
at every moment, not only at the moments they look.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import itertools
import threading
import uuid
from pathlib import Path
from typing import Any

import attrs
import jsonpatch
import kmock
import pytest
import yaml
from crd_support import admit, crd_schema

NAMESPACE = "ml"
CRD_PATH = Path(__file__).resolve().parents[2] / "manifests" / "crd.yaml"
CR = "eagle3.dev/v1alpha1/eagle3targets"
SCHEMA = crd_schema(CRD_PATH)


def _merge_diff(old: Any, new: Any) -> Any:
    """The JSON merge-patch turning `old` into `new` (None deletes a key), which is what kmock applies."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return copy.deepcopy(new)
    diff = {k: None for k in old if k not in new}
    for key, value in new.items():
        if key not in old:
            diff[key] = copy.deepcopy(value)
        elif old[key] != value:
            diff[key] = _merge_diff(old[key], value)
    return diff


def _rv(obj: dict) -> int:
    return int(obj.get("metadata", {}).get("resourceVersion") or 0)


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    _versions: itertools.count = attrs.field(factory=lambda: itertools.count(1), init=False)
    _latest: int = attrs.field(default=0, init=False)
    # pod name -> what admission answers to its creation
    refusals: dict[str, kmock.KubernetesError] = attrs.field(factory=dict, init=False)
    # resources ("group/version/plural") that answer 503 to everything
    outages: set[str] = attrs.field(factory=set, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback["get /version/"] << self._serve_server_version  # kr8s asks with a trailing slash

    async def _serve_server_version(self, request: kmock.Request):
        return {**await super()._serve_server_version(request), "minor": "33", "gitVersion": "v1.33.0"}

    def _next_version(self) -> str:
        self._latest = next(self._versions)
        return str(self._latest)

    def _stored(self, request: kmock.Request):
        key = (request.resource, request.namespace, request.name)
        obj = self.objects._objects.get(key)
        return None if obj is None or obj.deleted else obj

    async def _handle(self, request: kmock.Request):
        if request.resource is not None and any(request.resource == kmock.resource(r) for r in self.outages):
            return await self._render_error(kmock.KubernetesError(status=503, reason="ServiceUnavailable"))
        if request.resource is not None and request.action in (
            kmock.action.CREATE,
            kmock.action.UPDATE,
            kmock.action.DELETE,
        ):
            try:
                request = self._stamp(request)
            except kmock.KubernetesError as e:
                return await self._render_error(e)
        return await super()._handle(request)

    def _stamp(self, request: kmock.Request) -> kmock.Request:
        res = request.resource
        if request.action == kmock.action.CREATE:
            refusal = self.refusals.get((request.data.get("metadata") or {}).get("name"))
            if res == kmock.resource("v1/pods") and refusal is not None:
                raise refusal  # an admission webhook or Pod Security saying no
            data = copy.deepcopy(request.data)
            meta = data.setdefault("metadata", {})
            meta.setdefault("namespace", request.namespace)
            if not meta.get("name") and meta.get("generateName"):  # kopf's events
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:8]
            created = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            meta.update(
                uid=str(uuid.uuid4()),
                resourceVersion=self._next_version(),
                generation=1,
                creationTimestamp=created,
            )
            data["apiVersion"] = f"{res.group}/{res.version}" if res.group else res.version
            data["kind"] = self.resources[res].kind
            return _with_data(request, self._admit(res, data))
        current = self._stored(request)
        if current is None:
            return request  # kmock answers 404 itself
        if request.action == kmock.action.DELETE:
            # the DELETED event must be newer than whatever a watcher has seen
            current.patch({"metadata": {"resourceVersion": self._next_version()}})
            return request
        old = copy.deepcopy(current.raw)
        precondition = isinstance(request.data, dict) and request.data.get("metadata", {}).get(
            "resourceVersion"
        )
        if precondition and precondition != old["metadata"].get("resourceVersion"):
            raise kmock.KubernetesError(status=409, reason="Conflict", message="the object has been modified")
        if isinstance(request.data, list):
            try:
                new = jsonpatch.apply_patch(old, request.data)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
                raise kmock.KubernetesError(status=422, reason="Invalid", message=str(e)) from None
        else:
            new = copy.deepcopy(old)
            _apply_merge(new, request.data or {})
        if request.subresource == "status":  # only status changes through /status
            new = {**old, "metadata": copy.deepcopy(old["metadata"]), "status": new.get("status")}
        elif new.get("spec") != old.get("spec"):  # main resource or /scale
            new.setdefault("metadata", {})["generation"] = old.get("metadata", {}).get("generation", 1) + 1
        new.setdefault("metadata", {})["resourceVersion"] = self._next_version()
        return _with_data(request, _merge_diff(old, self._admit(res, new)))

    def _admit(self, res, obj: dict) -> dict:
        """Eagle3Targets are stored pruned and defaulted by the CRD's schema, as a real API server does."""
        return admit(SCHEMA, obj) if res == kmock.resource(CR) else obj

    async def _serve_list(self, request: kmock.Request):
        result = await super()._serve_list(request)
        result["metadata"]["resourceVersion"] = str(self._latest)
        return result

    async def _serve_watch(self, request: kmock.Request):
        since = int(request.params.get("resourceVersion") or 0)
        async for event in super()._serve_watch(request):
            if isinstance(event, dict) and _rv(event.get("object", {})) <= since:
                continue  # kmock replays every object on each watch; the client listed those already
            yield event


def _with_data(request: kmock.Request, data: Any) -> kmock.Request:
    # attrs.evolve() yields a Request that no kmock reaction matches, so swap the payload in place
    object.__setattr__(request, "data", data)
    return request


def _apply_merge(target: dict, patch: dict) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _apply_merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _register(kube: KubeEmulator) -> None:
    crd = yaml.safe_load(CRD_PATH.read_text())
    names = crd["spec"]["names"]
    kube.resources[CR] = kmock.ResourceInfo(
        kind=names["kind"],
        singular=names["singular"],
        shortnames=names["shortNames"],
        namespaced=True,
        subresources={"status", "scale"},
        verbs={"list", "watch", "get", "patch", "create", "delete"},
    )
    for plural, kind, namespaced in [
        ("pods", "Pod", True),
        ("services", "Service", True),
        ("configmaps", "ConfigMap", True),
        ("secrets", "Secret", True),
        ("events", "Event", True),
        ("namespaces", "Namespace", False),
        ("nodes", "Node", False),
    ]:
        kube.resources[f"v1/{plural}"] = kmock.ResourceInfo(
            kind=kind, namespaced=namespaced, verbs={"list", "watch", "get", "patch", "create", "delete"}
        )
    kube.resources["policy/v1/poddisruptionbudgets"] = kmock.ResourceInfo(
        kind="PodDisruptionBudget",
        namespaced=True,
        verbs={"list", "watch", "get", "patch", "create", "delete"},
    )
    kube.resources["coordination.k8s.io/v1/leases"] = kmock.ResourceInfo(
        kind="Lease", namespaced=True, verbs={"list", "watch", "get", "patch", "create", "delete"}
    )
    kube.objects["v1/namespaces", None, NAMESPACE] = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "resourceVersion": "0"},
    }


class Cluster:
    """Test-side access to the emulated cluster: objects as the operator left them, and pod readiness."""

    namespace = NAMESPACE
    eventually = staticmethod(lambda check, timeout=15.0: eventually(check, timeout))

    def __init__(self, kube: KubeEmulator, server: kmock.Server) -> None:
        self.kube = kube
        self.server = server

    def _live(self, resource: str) -> dict[str, dict]:
        return {
            key[2]: obj.raw
            for key, obj in self.kube.objects.items()
            if key[0] == kmock.resource(resource) and key[1] == NAMESPACE and not obj.deleted
        }

    def pods(self) -> dict[str, dict]:
        return self._live("v1/pods")

    def services(self) -> dict[str, dict]:
        return self._live("v1/services")

    def configmaps(self) -> dict[str, dict]:
        return self._live("v1/configmaps")

    def events(self) -> list[dict]:
        return list(self._live("v1/events").values())

    def target(self, name: str) -> dict:
        return self._live(CR)[name]

    def targets(self) -> dict[str, dict]:
        return self._live(CR)

    def leases(self) -> dict[str, dict]:
        return self._live("coordination.k8s.io/v1/leases")

    @staticmethod
    def is_ready(pod: dict) -> bool:
        conditions = (pod.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json"):
        headers = {"Content-Type": content_type}
        async with self.server.client.request(method, path, json=body, headers=headers) as resp:
            payload = await resp.json()
            assert resp.status < 300, (resp.status, payload.get("message"), payload.get("details"))
            return payload

    async def create_target(self, name: str, spec: dict, **extra: Any) -> dict:
        body = {
            "apiVersion": "eagle3.dev/v1alpha1",
            "kind": "Eagle3Target",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": spec,
            **extra,
        }
        return await self.request(
            "POST", f"/apis/eagle3.dev/v1alpha1/namespaces/{NAMESPACE}/eagle3targets", body
        )

    async def patch_target(self, name: str, patch: dict, subresource: str = "") -> dict:
        path = f"/apis/eagle3.dev/v1alpha1/namespaces/{NAMESPACE}/eagle3targets/{name}"
        path += f"/{subresource}" if subresource else ""
        return await self.request("PATCH", path, patch, "application/merge-patch+json")

    async def set_pod_ready(self, name: str, ip: str, ready: bool = True) -> None:
        """What the kubelet would report; here a stand-in pod IP on loopback."""
        status = {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        }
        await self.set_pod_status(name, status)

    async def set_pod_status(self, name: str, status: dict) -> None:
        path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/status"
        await self.request("PATCH", path, {"status": status}, "application/merge-patch+json")

    async def patch_pod(self, name: str, patch: dict) -> None:
        path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"
        await self.request("PATCH", path, patch, "application/merge-patch+json")

    async def delete(self, plural: str, name: str) -> None:
        await self.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/{plural}/{name}")

    async def delete_target(self, name: str) -> None:
        await self.request("DELETE", f"/apis/eagle3.dev/v1alpha1/namespaces/{NAMESPACE}/eagle3targets/{name}")


async def eventually(check, timeout: float = 15.0, interval: float = 0.05):
    """Poll `check()` until it returns a truthy value (returned) or fails with its last AssertionError."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
            error = AssertionError(f"{check.__name__} stayed falsy")
        except AssertionError as e:
            error = e
        if asyncio.get_running_loop().time() > deadline:
            raise error
        await asyncio.sleep(interval)


@pytest.fixture
async def cluster(tmp_path, monkeypatch):
    async with KubeEmulator() as kube, kmock.Server(kube) as server:
        _register(kube)
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": str(server.url).rstrip("/")}}],
            "users": [{"name": "kmock", "user": {"token": "test-token"}}],
            "contexts": [
                {"name": "kmock", "context": {"cluster": "kmock", "user": "kmock", "namespace": NAMESPACE}}
            ],
        }
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig))
        monkeypatch.setenv("KUBECONFIG", str(path))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield Cluster(kube, server)


class Operator:
    """The operator's real handlers in kopf, in a thread of its own with its own event loop: on exit kopf
    cancels every task of its loop that it did not start, pytest's teardown included."""

    def __init__(self, **config: Any) -> None:
        import kopf

        from eagle3_target.operator.config import OperatorConfig

        self.config = OperatorConfig(
            **{"default_image": "registry.test/eagle3-target:test", "interval": 0.2, **config}
        )
        self.memo = kopf.Memo(config=self.config)
        self._ready, self._stop = threading.Event(), threading.Event()
        coro = kopf.operator(
            clusterwide=True, standalone=True, ready_flag=self._ready, stop_flag=self._stop, memo=self.memo
        )
        self._thread = threading.Thread(target=asyncio.run, args=(coro,), name="kopf", daemon=True)

    async def start(self) -> None:
        import eagle3_target.operator.handlers  # noqa: F401  (registers the handlers)

        self._thread.start()
        assert await asyncio.to_thread(self._ready.wait, 15), "the operator did not start"

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 30)
        assert not self._thread.is_alive(), "the operator did not stop"


@pytest.fixture
async def start_operator(cluster):
    """Start the real operator with OperatorConfig overrides; it stops when the test ends."""
    started = []

    async def start(**config: Any) -> Operator:
        operator = Operator(**config)
        await operator.start()
        started.append(operator)
        return operator

    yield start
    for operator in started:
        await operator.stop()


@pytest.fixture
async def operator(cluster, start_operator):
    """The cluster, with the operator running on test settings (resync every 0.2 s, one operator)."""
    await start_operator()
    return cluster
