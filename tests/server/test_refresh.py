"""POST /weights/refresh on a real server with a tiny Llama: new weights serve bit for bit as a fresh load of
them, every reply names its weights, running requests finish on the old ones, and every bad source is refused
before anything that serves is touched."""

import asyncio
import json
import shutil
import threading
import time

import pytest
import torch
from moto.server import ThreadedMotoServer
from safetensors.torch import load_file, save_file
from target_support import free_port, generate_body, serve, vocab_body

from eagle3_target.protocol import contract
from eagle3_target.server.errors import InvalidInput
from eagle3_target.server.options import ServerOptions
from eagle3_target.server.runners.hf import HFRunner
from eagle3_target.server.runners.tiny import build_tiny_llama
from eagle3_target.server.weight_source import check_finite

ADMIN, TRAINER = "admin-secret", "trainer-secret"
BATCH = generate_body(torch.arange(48).view(3, 16) % 500)


@pytest.fixture(scope="module")
def weights_b(tmp_path_factory):
    path = tmp_path_factory.mktemp("weights-b")
    build_tiny_llama(seed=2).save_pretrained(path)
    return path


def admin(token: str = ADMIN) -> dict:
    return {"Authorization": f"Bearer {token}"}


async def start(folder, **options):
    """A server of ``folder`` (None: the embedded default) with the admin token."""
    return serve(
        lambda: HFRunner.load(None if folder is None else str(folder)),
        ServerOptions(auth_token=TRAINER, **{"admin_token": ADMIN, **options}),
    )


async def answer(server) -> tuple[str, bytes]:
    """(version header, reply body) of one /generate of BATCH, the session's draft vocabulary set first."""
    ids = torch.arange(0, 512, 5)
    mask = torch.zeros(512, dtype=torch.bool)
    mask[ids] = True
    headers = admin(TRAINER)
    async with server.http.post(
        f"{server.url}/set_vocab_mapping", data=vocab_body(ids, mask), headers=headers
    ):
        pass
    async with server.http.post(f"{server.url}/generate", data=BATCH, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        return resp.headers[contract.TARGET_VERSION_HEADER], await resp.read()


async def refresh(server, source, version, headers=None) -> tuple[int, dict]:
    body = json.dumps({"source": str(source), "version": version})
    async with server.http.post(
        f"{server.url}/weights/refresh", data=body, headers=admin() if headers is None else headers
    ) as resp:
        return resp.status, await resp.json()


async def version_of(server) -> str:
    async with server.http.post(f"{server.url}/model_info", headers=admin(TRAINER)) as resp:
        return (await resp.json())["target_version"]


async def fresh_answer(folder) -> bytes:
    async with await start(folder) as fresh:
        return (await answer(fresh))[1]


async def test_a_refresh_serves_the_new_weights_as_a_fresh_load_and_names_them(tiny_model_dir, weights_b):
    async with await start(tiny_model_dir) as server:
        started, before = await answer(server)
        assert started == await version_of(server) and started.startswith("sha256-")
        assert await refresh(server, weights_b, "policy-step-1") == (200, {"version": "policy-step-1"})
        assert await version_of(server) == "policy-step-1"
        assert await answer(server) == ("policy-step-1", await fresh_answer(weights_b))
        # and back: the first weights again, under a label of their own
        assert await refresh(server, tiny_model_dir, "policy-step-0") == (200, {"version": "policy-step-0"})
        assert await answer(server) == ("policy-step-0", before)
        async with server.http.get(f"{server.url}/metrics") as resp:
            text = await resp.text()
        assert 'eagle3_target_target_version_info{version="policy-step-0"} 1.0' in text
        assert 'eagle3_target_weight_refreshes_total{outcome="served"} 2.0' in text


async def test_the_embedded_default_refreshes_from_a_checkpoint_of_its_own_build(weights_b):
    assert (await fresh_answer(weights_b)) != (await fresh_answer(None))
    async with await start(None) as server:
        assert await refresh(server, weights_b, "ft-2") == (200, {"version": "ft-2"})
        assert await answer(server) == ("ft-2", await fresh_answer(weights_b))


async def test_model_info_says_when_the_refresh_began_and_weight_replies_name_their_version(
    tiny_model_dir, weights_b
):
    async with await start(tiny_model_dir) as server:
        info = await (await server.http.post(f"{server.url}/model_info", headers=admin(TRAINER))).json()
        assert "refreshed_at" not in info, "start-up weights: no refresh yet"
        before = time.time()
        assert (await refresh(server, weights_b, "policy-step-1"))[0] == 200
        info = await (await server.http.post(f"{server.url}/model_info", headers=admin(TRAINER))).json()
        assert before <= info["refreshed_at"] <= time.time()
        await answer(server)  # sets the session's draft vocabulary, which /lm_head reads
        for path in ("input_embeddings", "lm_head"):
            async with server.http.post(f"{server.url}/{path}", headers=admin(TRAINER)) as resp:
                assert resp.status == 200 and resp.headers[contract.TARGET_VERSION_HEADER] == "policy-step-1"


def bad_sources(root, weights_b):
    """(case, source folder or URI, version): each a refresh that must be refused."""
    tensors = load_file(weights_b / "model.safetensors")
    cases = {}

    def variant(name, change):
        folder = root / name
        shutil.copytree(weights_b, folder)
        save_file(change(dict(tensors)), folder / "model.safetensors")
        cases[name] = folder

    variant("missing-tensor", lambda t: {k: v for k, v in t.items() if k != "model.norm.weight"})
    variant("extra-tensor", lambda t: {**t, "model.extra.weight": torch.ones(3)})
    variant("nan", lambda t: {**t, "lm_head.weight": torch.full_like(t["lm_head.weight"], float("nan"))})
    variant("reshaped", lambda t: {**t, "model.norm.weight": torch.ones(32)})
    truncated = root / "truncated"
    shutil.copytree(weights_b, truncated)
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    other = root / "other-architecture"
    build_tiny_llama(seed=2, hidden_size=32).save_pretrained(other)
    no_config = root / "other-shapes-no-config"
    shutil.copytree(other, no_config)
    (no_config / "config.json").unlink()
    empty = root / "empty"
    empty.mkdir()
    return [
        *((name, folder, "v2") for name, folder in cases.items()),
        ("truncated", truncated, "v2"),
        ("other-architecture", other, "v2"),
        ("other-shapes-no-config", no_config, "v2"),
        ("no-weights", empty, "v2"),
        ("unreachable", root / "nowhere", "v2"),
        ("bad-version", weights_b, "v 2"),
    ]


async def test_every_bad_source_is_refused_before_anything_that_serves_changes(
    tiny_model_dir, weights_b, tmp_path
):
    async with await start(tiny_model_dir) as server:
        version, before = await answer(server)
        for case, source, label in bad_sources(tmp_path, weights_b):
            status, body = await refresh(server, source, label)
            assert 400 <= status < 500 and set(body) == {"error", "detail"}, (case, status, body)
            assert "\n" not in body["detail"], case
            assert await answer(server) == (version, before), case
            assert await version_of(server) == version, case
        for body in (b"not json", b'{"source": "x"}', json.dumps({"source": "", "version": "v"}).encode()):
            async with server.http.post(f"{server.url}/weights/refresh", data=body, headers=admin()) as resp:
                assert resp.status == 400 and (await resp.json())["error"] == "invalid_refresh"
        async with server.http.get(f"{server.url}/metrics") as resp:
            assert 'eagle3_target_weight_refreshes_total{outcome="refused"} 9.0' in await resp.text()


async def test_only_the_admin_token_refreshes_and_only_where_the_flag_gave_one(tiny_model_dir, weights_b):
    async with await start(tiny_model_dir) as server:
        for headers in (admin(TRAINER), {}, admin("guess")):
            status, body = await refresh(server, weights_b, "v2", headers)
            assert status == 401 and body["error"] == "unauthorized"
        async with server.http.post(f"{server.url}/model_info", headers=admin()) as resp:
            assert resp.status == 401  # the admin token is no trainer's
    async with await start(tiny_model_dir, admin_token=None) as server:
        status, body = await refresh(server, weights_b, "v2")
        assert status == 403 and body["error"] == "refresh_disabled"
        assert "--admin-token-file" in body["detail"]


async def test_a_request_running_at_the_swap_finishes_on_the_old_weights(tiny_model_dir, weights_b):
    async with await start(tiny_model_dir) as server:
        old_version, old = await answer(server)
        model = server.server.service.model
        queue = model._thread._work_queue  # the model thread's queue: who runs after whom
        gate = threading.Event()
        hold = asyncio.create_task(model.call(gate.wait))  # the model thread waits on the gate
        try:
            async with asyncio.timeout(30):
                while queue.qsize():
                    await asyncio.sleep(0.01)
                running = asyncio.create_task(answer(server))
                while queue.qsize() < 1:
                    await asyncio.sleep(0.01)
                swapping = asyncio.create_task(refresh(server, weights_b, "v2"))
                while queue.qsize() < 2:
                    await asyncio.sleep(0.01)
        finally:
            gate.set()
        await hold
        assert await running == (old_version, old)
        assert await swapping == (200, {"version": "v2"})
        assert await answer(server) == ("v2", await fresh_answer(weights_b))


async def test_replies_around_a_refresh_each_come_from_the_weights_they_name(tiny_model_dir, weights_b):
    async with await start(tiny_model_dir) as server:
        expected = {(await answer(server))[0]: (await answer(server))[1], "v2": await fresh_answer(weights_b)}
        early = [asyncio.create_task(answer(server)) for _ in range(3)]
        swapping = asyncio.create_task(refresh(server, weights_b, "v2"))
        late = [asyncio.create_task(answer(server)) for _ in range(3)]
        replies = await asyncio.gather(*early, *late)
        assert (await swapping)[0] == 200
        assert all(expected[version] == body for version, body in replies)
        assert (await answer(server))[0] == "v2"


@pytest.fixture
def s3(monkeypatch, weights_b):
    """A moto S3 server on loopback holding weights B under s3://checkpoints/policy/b."""
    import boto3

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3")
    client.create_bucket(Bucket="checkpoints")
    for path in weights_b.iterdir():
        client.upload_file(str(path), "checkpoints", f"policy/b/{path.name}")
    try:
        yield
    finally:
        server.stop()


async def test_a_refresh_from_s3(tiny_model_dir, weights_b, s3):
    async with await start(tiny_model_dir) as server:
        version, before = await answer(server)
        for source in ("s3://checkpoints/policy/nothing", "s3://no-such-bucket/b"):
            status, body = await refresh(server, source, "v2")
            assert status == 400 and body["error"] == "source_unreachable", body
            assert await answer(server) == (version, before)
        assert await refresh(server, "s3://checkpoints/policy/b", "v2") == (200, {"version": "v2"})
        assert await answer(server) == ("v2", await fresh_answer(weights_b))


NON_FINITE = [
    (dtype, value)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn)
    for value in (float("nan"), float("inf"), float("-inf"))
    if dtype != torch.float8_e4m3fn or value != value  # e4m3fn holds no infinity (it saturates)
]


@pytest.mark.parametrize(("dtype", "value"), NON_FINITE)
def test_a_single_non_finite_value_anywhere_in_a_tensor_is_found(dtype, value):
    for size in (1, 17, 4099):
        for at in {0, size // 2, size - 1}:
            tensor = torch.randn(size).to(dtype)
            tensor[at] = value
            with pytest.raises(InvalidInput, match="source_corrupt|NaN or infinite"):
                check_finite({"w": torch.zeros(3), "x": tensor}, "src")
    check_finite({"w": torch.randn(5).to(dtype), "empty": torch.empty(0, dtype=dtype)}, "src")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_finite_values_whose_sum_overflows_are_finite(dtype):
    largest = torch.finfo(dtype).max
    tensor = torch.full((64,), largest, dtype=dtype)
    assert not torch.isfinite(tensor.sum())  # the quick proof fails, so the exact check decides
    check_finite({"w": tensor, "v": -tensor}, "src")
