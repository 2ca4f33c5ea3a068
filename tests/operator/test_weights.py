"""spec.weights: a change refreshes replicas in place and never touches the pod template; new pods wait behind
a readiness gate until they serve the version; the refresh calls (against real aiohttp servers on loopback) go
at most max(maxUnavailable, 1) at a time, record the answer on the pod and report a refusal; status and
`kubectl get` show the version and how many replicas serve it; the admin token is the operator's own Secret."""

from __future__ import annotations

import asyncio
import base64
import time

import jsonschema
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from crd_support import crd_schema
from pod_state_support import pod_state

from eagle3_target.operator import builders, discovery, refresh
from eagle3_target.operator.planner import PodState, Rollout
from eagle3_target.operator.status import Observed, compute_status
from eagle3_target.operator.target_spec import TargetSpec
from eagle3_target.operator.weights import (
    READINESS_GATE,
    RESTARTS_ANNOTATION,
    VERSION_ANNOTATION,
    Weights,
    admin_secret,
    to_refresh,
)

A = {"source": "/models/ft-1", "version": "ft-1"}
B = {"source": "s3://bucket/ft-2", "version": "ft-2"}
TOKEN = "admin-secret-token"


def target(**spec) -> TargetSpec:
    parsed = TargetSpec.parse({"model": "m", "replicas": 2, **spec})
    assert parsed.problems() == []
    return parsed


def test_changing_weights_changes_no_pod_template_and_no_revision():
    plain, at_a, at_b = target(), target(weights=A), target(weights=B)
    assert builders.revision(plain) == builders.revision(at_a) == builders.revision(at_b)
    assert builders.pod(at_a, "t", "ml", 1, "img") == builders.pod(at_b, "t", "ml", 1, "img")
    gated = builders.pod(at_a, "t", "ml", 1, "img")["spec"]
    assert gated["readinessGates"] == [{"conditionType": READINESS_GATE}]
    assert "readinessGates" not in builders.pod(plain, "t", "ml", 1, "img")["spec"]


def test_every_pod_mounts_the_admin_token_and_trainers_never_see_it():
    pod = builders.pod(target(authTokenSecret={"name": "trainers"}), "t", "ml", 0, "img")
    container = pod["spec"]["containers"][0]
    assert container["args"][-2:] == ["--admin-token-file", "/var/run/eagle3-target-admin/token"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["admin-token"]["secret"]["secretName"] == "t-admin"
    assert volumes["auth-token"]["secret"]["secretName"] == "trainers"
    mount = next(m for m in container["volumeMounts"] if m["name"] == "admin-token")
    assert mount["readOnly"] is True
    client = discovery.client_configmap(target(), "t", "ml")
    assert "admin" not in str(client)  # what trainer pods pull in names no admin Secret
    secret = admin_secret("t", "ml", builders.labels("t", "admin"))
    assert secret["metadata"]["name"] == "t-admin" and len(base64.b64decode(secret["data"]["token"])) >= 32
    assert admin_secret("t", "ml", {})["data"] != secret["data"]  # random per target


@pytest.mark.parametrize(
    ("weights", "fragment"),
    [
        ({"source": "gs://b/x", "version": "v"}, "neither an absolute path nor an s3:// URI"),
        ({"source": "models/x", "version": "v"}, "neither an absolute path"),
        ({"source": "/m", "version": ""}, "weights.version ''"),
        ({"source": "/m", "version": "has space"}, "letters, digits"),
        ({"source": "/m", "version": "x" * 129}, "1 to 128"),
    ],
)
def test_bad_weights_are_refused_as_the_crd_refuses_them(weights, fragment):
    problems = TargetSpec.parse({"model": "m", "weights": weights}).problems()
    assert any(fragment in p for p in problems), problems


def test_the_crd_declares_weights_with_cel_rules_and_the_status_columns():
    schema = crd_schema()
    weights = schema["properties"]["spec"]["properties"]["weights"]
    assert weights["required"] == ["source", "version"]
    messages = [
        r["message"] for r in weights["x-kubernetes-validations"]
    ]  # enforced in tests/cluster/test_crd.py
    assert messages[0].startswith("weights.source") and messages[1].startswith("weights.version")
    validator = jsonschema.Draft7Validator(schema)
    assert list(validator.iter_errors({"spec": {"model": "m", "weights": {"source": "/m"}}}))
    assert not list(validator.iter_errors({"spec": {"model": "m", "weights": B}}))


def up(ordinal: int, version: str = "", ready: bool = True, **kw) -> PodState:
    return pod_state(
        ordinal, ready=ready, **{"serving": True, "target_version": version, "gated": True, **kw}
    )


def test_to_refresh_takes_new_pods_first_within_the_budget():
    pods = [up(0, "ft-1"), up(1, "ft-1"), up(2, ready=False), up(3, "ft-2")]
    names = lambda chosen: [p.name for p in chosen]  # noqa: E731
    assert names(to_refresh(pods, "ft-2", 4, 1, set(), set())) == ["t-2"]  # not yet an endpoint: first
    assert names(to_refresh(pods, "ft-2", 4, 2, set(), set())) == ["t-2", "t-0"]
    assert names(to_refresh(pods, "ft-2", 4, 2, {"t-2"}, set())) == ["t-0"]  # one under way counts
    assert names(to_refresh(pods, "ft-2", 4, 1, {"t-2"}, set())) == []
    assert names(to_refresh(pods, "ft-2", 4, 5, set(), {"t-0"})) == ["t-2", "t-1"]  # resting after a refusal
    assert names(to_refresh(pods, "ft-2", 2, 5, set(), set())) == ["t-0", "t-1"]  # ordinals past replicas
    starting = [up(0, serving=False), up(1, terminating=True), up(2, ip=None), up(3, rank=1)]
    assert to_refresh(starting, "ft-2", 4, 4, set(), set()) == []


def test_a_restarted_server_no_longer_counts_as_refreshed():
    def read(restarts: int) -> str:
        annotations = {VERSION_ANNOTATION: "ft-2", RESTARTS_ANNOTATION: "0"}
        body = {"metadata": {"name": "t-0", "annotations": annotations}, "status": {}}
        body["status"]["containerStatuses"] = [{"name": "server", "restartCount": restarts}]
        return PodState.from_pod(body).target_version

    assert (read(0), read(1)) == ("ft-2", "")


class Replica:
    """A real HTTP server standing in for one target pod's refresh endpoint."""

    def __init__(self, host: str, answer: int = 200, delay: float = 0.0):
        self.host, self.answer, self.delay, self.asked = host, answer, delay, []
        app = web.Application()
        app.router.add_post(refresh.REFRESH_PATH, self.handle)
        self.server = TestServer(app, host=host, port=0)

    async def handle(self, request: web.Request) -> web.Response:
        self.asked.append((request.headers.get("Authorization"), await request.json()))
        await asyncio.sleep(self.delay)
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"error": "unauthorized", "detail": "admin token"}, status=401)
        if self.answer != 200:
            return web.json_response(
                {"error": "bad_source", "detail": "no such checkpoint"}, status=self.answer
            )
        return web.json_response({"version": (await request.json())["version"]})

    def state(self, ordinal: int, **kw) -> PodState:
        return up(ordinal, ip=self.host, http_port=self.server.port, name=f"t-{ordinal}", **kw)


class FakeChildren:
    """What the refresh writes to the API (kube.Children's interface), recorded."""

    def __init__(self):
        self.patches, self.events = [], []

    async def patch_pod(self, name, namespace, annotations, gate):
        self.patches.append((name, annotations, gate))

    async def post_event(self, body, type_, reason, message):
        self.events.append((reason, message))


BODY = {"metadata": {"name": "t", "namespace": "ml"}}


async def test_refresh_replica_reads_the_answer_and_names_the_url_on_refusal():
    good, bad = Replica("127.0.0.2"), Replica("127.0.0.3", answer=422)
    async with good.server, bad.server:
        url = f"http://127.0.0.2:{good.server.port}{refresh.REFRESH_PATH}"
        assert await refresh.refresh_replica(url, TOKEN, Weights(**B), 5) == "ft-2"
        assert good.asked == [(f"Bearer {TOKEN}", B)]
        with pytest.raises(refresh.RefreshError, match="HTTP 401"):
            await refresh.refresh_replica(url, "trainer-token", Weights(**B), 5)
        bad_url = f"http://127.0.0.3:{bad.server.port}{refresh.REFRESH_PATH}"
        with pytest.raises(refresh.RefreshError, match=r"127\.0\.0\.3.*HTTP 422.*no such checkpoint"):
            await refresh.refresh_replica(bad_url, TOKEN, Weights(**B), 5)
    with pytest.raises(refresh.RefreshError, match="ClientConnectorError"):  # the server is gone now
        await refresh.refresh_replica(url, TOKEN, Weights(**B), 5)


async def test_start_refreshes_within_the_budget_and_records_each_answer():
    replicas = [Replica("127.0.0.2", delay=0.2), Replica("127.0.0.3", delay=0.2)]
    children, refreshes = FakeChildren(), refresh.Refreshes(token=TOKEN)
    spec = target(weights=B)  # maxUnavailable 1
    async with replicas[0].server, replicas[1].server:
        pods = [replicas[0].state(0, version="ft-1"), replicas[1].state(1, version="ft-1", restarts=2)]
        assert refresh.start(refreshes, spec, pods, BODY, children) == ["t-0"]
        assert refresh.start(refreshes, spec, pods, BODY, children) == []  # one at a time
        await asyncio.gather(*refreshes.busy.values())
        pods[0] = replicas[0].state(0, version="ft-2")
        assert refresh.start(refreshes, spec, pods, BODY, children) == ["t-1"]
        await asyncio.gather(*refreshes.busy.values())
    assert [len(r.asked) for r in replicas] == [1, 1]
    assert children.patches == [
        ("t-0", {}, (READINESS_GATE, False)),  # out of the endpoints while it changes version
        ("t-0", {VERSION_ANNOTATION: "ft-2", RESTARTS_ANNOTATION: "0"}, (READINESS_GATE, True)),
        ("t-1", {}, (READINESS_GATE, False)),
        ("t-1", {VERSION_ANNOTATION: "ft-2", RESTARTS_ANNOTATION: "2"}, (READINESS_GATE, True)),
    ]
    assert children.events == [] and refreshes.observed(spec) == {
        "weights_version": "ft-2",
        "refresh_errors": "",
    }


async def test_a_refusal_keeps_the_old_version_serving_is_reported_and_rests():
    replica, children = Replica("127.0.0.2", answer=400), FakeChildren()
    refreshes, spec = refresh.Refreshes(token=TOKEN), target(weights=B, replicas=1)
    async with replica.server:
        pods = [replica.state(0, version="ft-1")]
        assert refresh.start(refreshes, spec, pods, BODY, children) == ["t-0"]
        await asyncio.gather(*refreshes.busy.values())
        assert refresh.start(refreshes, spec, pods, BODY, children) == []  # resting
        later = time.time() + refresh.RETRY_SECONDS + 1
        assert refresh.start(refreshes, spec, pods, BODY, children, now=later) == ["t-0"]
        await asyncio.gather(*refreshes.busy.values())
    assert children.patches[:2] == [("t-0", {}, (READINESS_GATE, False)), ("t-0", {}, (READINESS_GATE, True))]
    assert children.events[0][0] == "RefreshFailed" and "HTTP 400" in children.events[0][1]
    errors = refreshes.observed(spec)["refresh_errors"]
    assert errors.startswith("t-0: http://127.0.0.2:") and "no such checkpoint" in errors
    assert refreshes.observed(target(weights={**B, "version": "ft-3"}))["refresh_errors"] == ""


async def test_a_new_pod_behind_the_gate_is_refreshed_and_let_in():
    replica, children = Replica("127.0.0.2"), FakeChildren()
    refreshes, spec = refresh.Refreshes(token=TOKEN), target(weights=B, replicas=1)
    async with replica.server:
        refresh.start(refreshes, spec, [replica.state(0, ready=False)], BODY, children)
        await asyncio.gather(*refreshes.busy.values())
    assert children.patches == [
        ("t-0", {VERSION_ANNOTATION: "ft-2", RESTARTS_ANNOTATION: "0"}, (READINESS_GATE, True))
    ]


def fleet_status(pods, errors=""):
    observed = Observed(Rollout(2, "new"), generation=1, weights_version="ft-2", refresh_errors=errors)
    return compute_status(name="t", pods=pods, observed=observed, selector="s", previous=None, at=0.0)


def test_status_shows_the_version_how_many_serve_it_and_refusals():
    both = fleet_status([up(0, "ft-2"), up(1, "ft-2")])
    assert (both["targetVersion"], both["targetVersionReplicas"]) == ("ft-2", 2)
    conditions = {c["type"]: c for c in both["conditions"]}
    assert conditions["Progressing"]["reason"] == "RolloutComplete"
    half = fleet_status([up(0, "ft-2"), up(1, "ft-1")], errors="t-1: HTTP 400")
    assert half["targetVersionReplicas"] == 1
    conditions = {c["type"]: c for c in half["conditions"]}
    assert conditions["Ready"]["reason"] == "AllTargetsReady"  # both still serve
    assert (conditions["Progressing"]["reason"], conditions["Progressing"]["message"]) == (
        "RefreshingWeights",
        "1/2 replicas serve weights ft-2",
    )
    assert (conditions["Degraded"]["reason"], conditions["Degraded"]["message"]) == (
        "RefreshFailed",
        "t-1: HTTP 400",
    )
    jsonschema.Draft7Validator(crd_schema()).validate({"spec": {"model": "m"}, "status": half})
    assert set(half) <= set(crd_schema()["properties"]["status"]["properties"])
