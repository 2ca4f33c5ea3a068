"""A tiny target and chat data for precompute tests, NeMo's own precompute as the reference, and our
command in this process or in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig

from eagle3_target import cli
from eagle3_target.client.precompute.cache import VERSION_FILE
from eagle3_target.server.runners.tiny import TINY_LLAMA

# The command's settings for the tiny data: 12 samples, shards of 4, so 3 shards of 2 batches.
FLAGS = ["--seq-length", "32", "--draft-vocab-size", "128", "--batch-size", "2", "--shard-size", "4"]
FLAGS += ["--dtype", "fp32"]
SYNTHETIC_LAYERS = 32  # the synthetic engine's default depth


class CpuAutoModel:
    """NeMo's model loader needs CUDA beyond its torch.cuda.current_device() call (it builds NeMo's own
    Llama on the meta device and materializes it on cuda:N); on CPU the reference loads the target with
    transformers instead, as the server's HF runner does."""

    @staticmethod
    def from_pretrained(path, torch_dtype, **_):
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)


def nemo_precompute(monkeypatch, output: Path, model: Path, chats: Path, *extra: str) -> Path:
    """NeMo 0.7.0's unchanged precompute_eagle3.main on CPU, in float32."""
    from nemo_automodel.components.speculative import precompute_eagle3

    monkeypatch.setattr(precompute_eagle3, "NeMoAutoModelForCausalLM", CpuAutoModel)
    argv = ["--target-model", str(model), "--input-data", str(chats), "--output-dir", str(output)]
    assert precompute_eagle3.main([*argv, *FLAGS, "--device", "cpu", *extra]) == 0
    return output


def argv(endpoints: str, output, model: Path, chats: Path, *extra: str) -> list[str]:
    base = ["precompute", "--endpoints", endpoints, "--target-model", str(model), "--input-data", str(chats)]
    return [*base, "--output-dir", str(output), *FLAGS, "--start-timeout", "60", *extra]


def precompute(*args: str) -> int:
    """`eagle3-target precompute ARGS` in this process (NeMo's imports are already paid for)."""
    return cli.main(list(args))


def precompute_process(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`eagle3-target precompute ARGS` in a process of its own (which SIGKILL can take)."""
    command = [sys.executable, "-m", "eagle3_target.cli", "--log-level", "WARNING", *args]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
    )


def cache_files(directory: Path) -> dict[str, bytes]:
    """NeMo's files of a cache by name: not temporaries (those start with a dot), nor the target version
    recorded beside them (cache_version)."""
    return {
        p.name: p.read_bytes()
        for p in sorted(directory.iterdir())
        if not p.name.startswith(".") and p.name != VERSION_FILE
    }


def cache_version(directory: Path) -> str:
    return json.loads((directory / VERSION_FILE).read_text())["target_version"]


def served_version(url: str) -> str:
    request = urllib.request.Request(f"{url}/model_info", data=b"", method="POST")
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=30) as reply:
        return json.load(reply)["target_version"]


def cache_tensors(directory: Path) -> dict[str, dict]:
    return {p.name: load_file(p) for p in sorted(directory.glob("*.safetensors"))}


def synthetic_target(path: Path, model: Path) -> Path:
    """The tokenizer of ``model`` with a config shaped like the synthetic engine's target."""
    path.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (model / name).exists():
            (path / name).write_bytes((model / name).read_bytes())
    LlamaConfig(**{**TINY_LLAMA, "num_hidden_layers": SYNTHETIC_LAYERS}).save_pretrained(path)
    return path
