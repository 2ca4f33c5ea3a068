"""`eagle3-target precompute --family dspark` writes, from a real server, the cache NeMo 0.7.0's own
precompute_dspark writes in-process for the same model, data and flags (CPU, float32): file for file, byte for
byte; also when two workers share it, and when a run resumes."""

from __future__ import annotations

import pytest
from nemo.nemo_support import make_data
from target_support import TargetProcess

from .precompute_support import CpuAutoModel, cache_files, precompute

SAMPLES = 12
# 12 samples in shards of 4: three shards of two batches. -1 is the embedding output, 7 the post-norm state.
FLAGS = ["--seq-length", "32", "--batch-size", "2", "--shard-size", "4", "--dtype", "fp32"]
FLAGS += ["--target-layer-ids", "-1", "3", "7"]
FILES = {"manifest.json", "target_weights.safetensors", *(f"shard-{i:06d}.safetensors" for i in range(3))}


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    root = tmp_path_factory.mktemp("dspark-target")
    words = make_data.write_target(root / "model", architecture="qwen3")
    make_data.write_conversations(root / "chats.jsonl", words, SAMPLES, seed=3)
    return root / "model", root / "chats.jsonl"


@pytest.fixture(scope="module")
def server(qwen3):
    process = TargetProcess("127.0.0.9", "--engine", "hf", "--model", str(qwen3[0]))
    try:
        yield process.wait_ready()
    finally:
        process.kill()


@pytest.fixture(scope="module")
def nemo_cache(qwen3, tmp_path_factory):
    """NeMo 0.7.0's unchanged precompute_dspark.main on CPU, in float32."""
    from nemo_automodel.components.speculative import precompute_dspark

    output = tmp_path_factory.mktemp("nemo-dspark-cache")
    model, chats = qwen3
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(precompute_dspark, "NeMoAutoModelForCausalLM", CpuAutoModel)
        argv = ["--target-model", str(model), "--input-data", str(chats), "--output-dir", str(output)]
        assert precompute_dspark.main([*argv, *FLAGS, "--device", "cpu"]) == 0
    return cache_files(output)


def ours(server, qwen3, output, *extra: str) -> int:
    model, chats = qwen3
    base = ["precompute", "--family", "dspark", "--endpoints", server.url, "--target-model", str(model)]
    return precompute(
        *base,
        "--input-data",
        str(chats),
        "--output-dir",
        str(output),
        *FLAGS,
        "--start-timeout",
        "60",
        *extra,
    )


def test_the_cache_equals_nemos_file_for_file(server, qwen3, nemo_cache, tmp_path):
    assert ours(server, qwen3, tmp_path) == 0
    assert nemo_cache.keys() == FILES
    assert cache_files(tmp_path) == nemo_cache


def test_two_workers_then_a_resumed_run_write_nemos_cache(server, qwen3, nemo_cache, tmp_path):
    assert ours(server, qwen3, tmp_path, "--worker-count", "2", "--worker-index", "1") == 0
    assert b'"complete": false' in cache_files(tmp_path)["manifest.json"]  # worker 0's shards are missing
    assert ours(server, qwen3, tmp_path, "--worker-count", "2", "--worker-index", "0") == 0
    assert cache_files(tmp_path) == nemo_cache
    (tmp_path / "shard-000001.safetensors").unlink()
    assert ours(server, qwen3, tmp_path) == 2  # shards there: --resume, or a fresh directory
    assert ours(server, qwen3, tmp_path, "--resume") == 0
    assert cache_files(tmp_path) == nemo_cache


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--draft-vocab-size", "128"], "--draft-vocab-size is a --family eagle3 flag"),
        (["--target-probs-topk", "8"], "--target-probs-topk is a --family eagle3 flag"),
    ],
)
def test_the_other_familys_flags_are_refused_in_one_line(qwen3, tmp_path, capsys, flags, message):
    assert ours(type("S", (), {"url": "http://127.0.0.1:9"}), qwen3, tmp_path, *flags) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_dspark_flags_are_refused_with_the_eagle3_family(qwen3, tmp_path, capsys):
    model, chats = qwen3
    argv = ["precompute", "--endpoints", "http://127.0.0.1:9", "--target-model", str(model)]
    argv += ["--input-data", str(chats), "--output-dir", str(tmp_path), "--target-layer-ids", "1"]
    assert precompute(*argv) == 2
    assert "--target-layer-ids is a --family dspark flag" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("family", "message"),
    [
        ("dflash", "--family dflash has no offline cache; families with one: dspark, eagle3"),
        ("medusa", "--family medusa: no such draft family (dflash, dspark, "),
    ],
)
def test_a_family_without_an_offline_cache_is_refused_in_one_line(qwen3, tmp_path, capsys, family, message):
    model, chats = qwen3
    argv = [
        "precompute",
        "--family",
        family,
        "--endpoints",
        "http://127.0.0.1:9",
        "--target-model",
        str(model),
    ]
    assert precompute(*argv, "--input-data", str(chats), "--output-dir", str(tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
