"""How the sglang engine builds SGLang's pieces: its names, ServerArgs and each rank's ModelRunner.

Nothing here imports SGLang until ``import_sglang`` is called (tests hand these functions a fake SGLang).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

# ServerArgs takes the dtype as a string.
SGLANG_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def sglang_dtype(dtype: torch.dtype) -> str:
    try:
        return SGLANG_DTYPES[dtype]
    except KeyError:
        choices = ", ".join(map(str, SGLANG_DTYPES))
        raise ValueError(f"the sglang engine has no dtype {dtype}; choose {choices}") from None


def import_sglang() -> SimpleNamespace:
    """The SGLang names this runner uses, in one place (tests put a fake SGLang in sys.modules)."""
    # Used through locals() below: the noqa keeps lint from deleting them as unused.
    from sglang.bench_one_batch import TreeCacheNamespace  # noqa: F401
    from sglang.srt.configs.model_config import ModelConfig  # noqa: F401
    from sglang.srt.distributed import tensor_model_parallel_all_gather  # noqa: F401
    from sglang.srt.distributed.parallel_state import cleanup_dist_env_and_memory  # noqa: F401
    from sglang.srt.layers.logits_processor import LogitsMetadata, LogitsProcessorOutput  # noqa: F401
    from sglang.srt.layers.moe import initialize_moe_config  # noqa: F401
    from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config  # noqa: F401
    from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config  # noqa: F401
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch  # noqa: F401
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch  # noqa: F401
    from sglang.srt.model_executor.model_runner import ModelRunner  # noqa: F401
    from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: F401
    from sglang.srt.server_args import ServerArgs  # noqa: F401
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: F401
    from sglang.srt.utils import get_free_port  # noqa: F401

    return SimpleNamespace(**locals())


def build_server_args(
    sgl,
    model: str,
    *,
    dtype: torch.dtype,
    gpu_id: int,
    mem_fraction_static: float,
    trust_remote_code: bool,
    tp_size: int = 1,
):
    return sgl.ServerArgs(
        model_path=model,
        dtype=sglang_dtype(dtype),
        device="cuda",
        base_gpu_id=gpu_id,
        tp_size=tp_size,  # as NeMo's serve_target passes --tp-size; pipeline parallel stays 1
        # Full-vocab logits for every position live outside SGLang's KV pool: leave them room.
        mem_fraction_static=mem_fraction_static,
        trust_remote_code=trust_remote_code,
        skip_tokenizer_init=True,
        # Only ever one prefill of fresh rows: no decode graphs, nothing worth caching.
        disable_cuda_graph=True,
        disable_radix_cache=True,
    )


def build_model_runner(sgl, server_args, gpu_id: int, tp_rank: int = 0):
    """This rank's ModelRunner, as SGLang's scheduler builds it. One rank makes its own one-rank group; the
    ranks of a split replica have joined theirs first (ranks.py), and SGLang takes that group over."""
    model_config = sgl.ModelConfig.from_server_args(server_args)
    sgl.initialize_moe_config(server_args)
    sgl.initialize_fp8_gemm_config(server_args)
    sgl.initialize_fp4_gemm_config(server_args)
    return sgl.ModelRunner(
        model_config=model_config,
        mem_fraction_static=server_args.mem_fraction_static,
        gpu_id=gpu_id,
        tp_rank=tp_rank,
        tp_size=server_args.tp_size,
        moe_ep_rank=0,
        moe_ep_size=1,
        pp_rank=0,
        pp_size=1,
        nccl_port=sgl.get_free_port(),
        server_args=server_args,
    )
