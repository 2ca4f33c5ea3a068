"""POST /weights/refresh on split hf replicas, every rank reading its own part of the source: tensor parallel 2
in one `serve`, pipeline parallel 2 over two `serve` processes as two nodes. Refreshed from A to B, each answers
as one device on B does (tensor parallel within 1e-4, pipeline parallel bit for bit) under the new version, and
back on A bit for bit as before. A source of other shapes, one missing a tensor, and one whose NaN only the
second rank reads are refused with a 4xx, and the replica answers as before under its version."""

import contextlib
import json
import shutil
import urllib.error
import urllib.request

import pytest
import torch
from parallel_support import (
    OPENER,
    assert_close,
    batch,
    post,
    replies,
    two_serve_processes,
    write_split_llama,
)
from safetensors.torch import load_file, save_file
from target_support import TargetProcess, free_port, generate_body

from eagle3_target.protocol import contract
from eagle3_target.server.runners.hf_pipeline import Stage, StageRunner, stage_layers, whole_layout
from eagle3_target.server.runners.tiny import build_tiny_llama

ADMIN = "fleet-admin"


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict:
    """Weights B, and the sources to refuse (each B but for one thing)."""
    root = tmp_path_factory.mktemp("sources")
    b = write_split_llama(root / "b", seed=7)
    tensors = load_file(b / "model.safetensors")
    found = {"b": b, "other-shapes": write_split_llama(root / "other-shapes", intermediate_size=96)}
    (found["other-shapes"] / "config.json").unlink()  # so the shapes themselves are checked, not the config

    def variant(name, change):
        shutil.copytree(b, root / name)
        save_file(change(dict(tensors)), root / name / "model.safetensors")
        found[name] = root / name

    variant(
        "missing-tensor", lambda t: {k: v for k, v in t.items() if k != "model.layers.7.mlp.down_proj.weight"}
    )
    nan = tensors["lm_head.weight"].clone()
    nan[400, 3] = float("nan")  # a row the second rank holds: its tensor-parallel shard, its pipeline stage
    variant("nan-on-rank-1", lambda t: {**t, "lm_head.weight": nan})
    return found


@pytest.fixture(scope="module")
def one_device_b(sources):
    server = TargetProcess("127.0.0.1", "--model", str(sources["b"])).wait_ready(300)
    yield replies(server.url)
    server.kill()


@contextlib.contextmanager
def split_replica(kind: str, flags: list[str]):
    if kind == "tp2":
        server = TargetProcess("127.0.0.1", *flags, "--tensor-parallel-size", "2")
        try:
            yield server.wait_ready(300).url
        finally:
            server.kill()
        return
    nodes = ["--pipeline-parallel-size", "2", "--nnodes", "2", "--master-port", str(free_port())]
    with two_serve_processes([*flags, *nodes]) as (leader, _follower):
        yield leader.wait_ready(300).url


@pytest.fixture(scope="module", params=["tp2", "pp2-two-nodes"])
def split(request, model, tmp_path_factory):
    """(kind, url, the replica's replies on A before any refresh): one replica for every test of its kind."""
    token = tmp_path_factory.mktemp("admin") / "token"
    token.write_text(ADMIN)
    with split_replica(request.param, ["--model", model, "--admin-token-file", str(token)]) as url:
        yield request.param, url, replies(url)


def refresh(url: str, source, version: str) -> tuple[int, dict]:
    body = json.dumps({"source": str(source), "version": version}).encode()
    try:
        return 200, json.loads(post(url, "weights/refresh", body, Authorization=f"Bearer {ADMIN}"))
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def versions(url: str) -> tuple[str, str]:
    """(/model_info's target_version, the version header of a /generate reply)."""
    ids, mask, loss = batch()
    request = urllib.request.Request(f"{url}/generate", data=generate_body(ids, mask, loss), method="POST")
    with OPENER.open(request, timeout=120) as resp:
        header = resp.headers[contract.TARGET_VERSION_HEADER]
    return json.loads(post(url, "model_info"))["target_version"], header


def assert_equal(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), f"{key}: {(got[key] - value).abs().max().item():.2e}"


@pytest.mark.parametrize(
    "case, error",
    [
        ("other-shapes", "source_mismatch"),
        ("missing-tensor", "source_incomplete"),
        ("nan-on-rank-1", "source_corrupt"),
    ],
)
def test_a_bad_source_is_refused_and_every_rank_serves_as_before(split, sources, case, error):
    _, url, before = split
    started = versions(url)
    status, refused = refresh(url, sources[case], f"v-{case}")
    assert status == 400 and refused["error"] == error, refused
    assert list(refused) == ["error", "detail"] and "\n" not in refused["detail"]
    if case == "nan-on-rank-1":  # rank 0 read its own part, and found nothing wrong
        assert refused["detail"].startswith("rank 1 of 2: "), refused
    assert versions(url) == started
    assert_equal(replies(url), before)


def test_a_refresh_serves_b_as_one_device_does_and_a_again_bit_for_bit(split, sources, model, one_device_b):
    kind, url, before = split
    assert refresh(url, sources["b"], "v-b") == (200, {"version": "v-b"})
    assert versions(url) == ("v-b", "v-b")
    on_b = replies(url)
    if kind == "tp2":  # all-reduce reorders additions (docs/parallel.md)
        assert_close(on_b, one_device_b)
    else:
        assert_equal(on_b, one_device_b)
    assert refresh(url, model, "v-a") == (200, {"version": "v-a"})
    assert versions(url) == ("v-a", "v-a")
    assert_equal(replies(url), before)


@pytest.mark.parametrize("tied", [False, True])
def test_the_stages_read_every_checkpoint_tensor_once_by_its_checkpoint_name(tied):
    """A tied lm_head on the last stage is the checkpoint's embedding, which the first stage holds as well."""
    layout, _ = whole_layout(build_tiny_llama(tie_word_embeddings=tied))
    held = []
    for rank in range(2):
        stage = Stage(rank, 2, stage_layers(rank, 2, 8), 8)
        model = build_tiny_llama(tie_word_embeddings=tied)
        _, mine = StageRunner(model, stage, "cpu", name="tiny").served_parts()
        assert set(mine) <= set(layout)
        held += list(mine)
    assert sorted(set(held)) == sorted(layout)
    assert len(held) == len(layout) + tied  # the tied embedding: on the first stage and the last
