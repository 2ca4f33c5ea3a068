"""vLLM tests run in vLLM's own environment (.ci/vllm); without vLLM only test_vllm_optional.py runs.
One vllm engine per process (runners/vllm.py): a module closes its engine before the next one loads."""

import os
from pathlib import Path

import pytest
from parallel_support import write_split_llama

from eagle3_target.server.runners import load_runner
from eagle3_target.server.runners.tiny import build_tiny_llama

from .split_support import AUX_LAYER_IDS, replies
from .vllm_support import VLLM_INSTALLED, VLLM_TINY

# Every module but test_vllm_optional.py needs vLLM: listed by pattern, so a new module cannot be forgotten.
collect_ignore = (
    []
    if VLLM_INSTALLED
    else sorted(
        path.name for path in Path(__file__).parent.glob("test_*.py") if path.name != "test_vllm_optional.py"
    )
)

# A small CPU KV cache: the tests' batches are tiny, and other processes share this machine.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory):
    """A tiny random Llama that vLLM's CPU backend can run, saved as a real model directory."""
    path = tmp_path_factory.mktemp("tiny-llama-hd32")
    build_tiny_llama(seed=3, **VLLM_TINY).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def order_one_dir(tmp_path_factory):
    """parallel_support's tiny Llama with values of order 1, for the split-replica tests."""
    return str(write_split_llama(tmp_path_factory.mktemp("split-llama")))


@pytest.fixture(scope="session")
def one_device(order_one_dir):
    """The one-device hf engine's replies: what a split replica must match within 1e-4."""
    runner = load_runner(
        "hf", model=order_one_dir, dtype="float32", device="cpu", aux_layer_ids=AUX_LAYER_IDS
    )
    yield replies(runner)
    runner.close()
