"""The real operator against kmock, with real HTTP servers on 127.0.0.2 and .3 standing in for the pods'
refresh endpoints: spec.weights reaches both replicas one at a time with the admin token of the Secret the
operator created, a new version refreshes them again without replacing a pod, and status counts them."""

from __future__ import annotations

import asyncio
import base64
import socket

from aiohttp import web
from aiohttp.test_utils import TestServer

from eagle3_target.operator import refresh
from eagle3_target.operator.weights import READINESS_GATE, VERSION_ANNOTATION

from .operator_support import SPEC


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Fleet:
    """One refresh endpoint per pod IP, all on one port (every pod's ports.http), each recording its asks."""

    def __init__(self, hosts: list[str], port: int):
        self.asked: list[tuple[str, str, dict]] = []
        self.running = 0
        self.most_at_once = 0
        self.servers = [TestServer(self._app(host), host=host, port=port) for host in hosts]

    def _app(self, host: str) -> web.Application:
        async def handle(request: web.Request) -> web.Response:
            body = await request.json()
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            await asyncio.sleep(0.2)
            self.running -= 1
            self.asked.append((host, request.headers["Authorization"], body))
            return web.json_response({"version": body["version"]})

        app = web.Application()
        app.router.add_post(refresh.REFRESH_PATH, handle)
        return app

    async def __aenter__(self):
        for server in self.servers:
            await server.start_server()
        return self

    async def __aexit__(self, *exc):
        for server in self.servers:
            await server.close()


async def test_weights_are_refreshed_in_place_one_at_a_time(operator):
    hosts = ["127.0.0.2", "127.0.0.3"]
    port = free_port(hosts[0])
    async with Fleet(hosts, port) as fleet:
        weights = {"source": "/models/ft-1", "version": "ft-1"}
        await operator.create_target("llama", {**SPEC, "ports": {"http": port}, "weights": weights})
        pods = await operator.eventually(lambda: len(operator.pods()) == 2 and operator.pods())
        assert all(p["spec"]["readinessGates"] == [{"conditionType": READINESS_GATE}] for p in pods.values())
        uids = {name: pod["metadata"]["uid"] for name, pod in pods.items()}
        for name in pods:  # the server answers; the gate keeps the pod out of the endpoints
            ip = hosts[int(name.rsplit("-", 1)[1])]
            conditions = [{"type": "Ready", "status": "False"}, {"type": "ContainersReady", "status": "True"}]
            await operator.set_pod_status(name, {"phase": "Running", "podIP": ip, "conditions": conditions})

        def at(version: str):
            status = operator.target("llama").get("status", {})
            versions = {
                p["metadata"].get("annotations", {}).get(VERSION_ANNOTATION) for p in operator.pods().values()
            }
            return versions == {version} and status.get("targetVersionReplicas") == 2 and status

        status = await operator.eventually(lambda: at("ft-1"))
        assert status["targetVersion"] == "ft-1"
        token = base64.b64decode(operator._live("v1/secrets")["llama-admin"]["data"]["token"]).decode()
        assert {auth for _, auth, _ in fleet.asked} == {f"Bearer {token}"}
        assert sorted(h for h, _, _ in fleet.asked) == hosts and fleet.most_at_once == 1

        for (
            name
        ) in pods:  # what the kubelet reports once the gate is True (kmock keeps only the last patch's)
            ip = hosts[int(name.rsplit("-", 1)[1])]
            gate = next(
                c for c in operator.pods()[name]["status"]["conditions"] if c["type"] == READINESS_GATE
            )
            assert gate["status"] == "True"
            conditions = [{"type": t, "status": "True"} for t in ("Ready", "ContainersReady", READINESS_GATE)]
            await operator.set_pod_status(name, {"phase": "Running", "podIP": ip, "conditions": conditions})
        await operator.eventually(lambda: operator.target("llama")["status"].get("readyReplicas") == 2)
        await operator.patch_target(
            "llama", {"spec": {"weights": {"source": "/models/ft-2", "version": "ft-2"}}}
        )
        await operator.eventually(lambda: at("ft-2"))
        assert [body["version"] for _, _, body in fleet.asked[2:]] == ["ft-2", "ft-2"]
        assert fleet.most_at_once == 1
        assert {
            name: pod["metadata"]["uid"] for name, pod in operator.pods().items()
        } == uids  # no pod replaced
