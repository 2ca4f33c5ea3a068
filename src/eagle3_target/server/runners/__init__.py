"""Target runners: one frozen model forward behind a small engine-agnostic seam."""

from ..options import UsageError
from ..parallel import ONE_DEVICE, ParallelLayout
from .base import HiddenStateRunner, RunnerInfo, TargetRunner, resolve_dtype

__all__ = ["HiddenStateRunner", "RunnerInfo", "TargetRunner", "resolve_dtype", "load_runner", "follow_runner"]


def load_runner(engine: str, **options) -> TargetRunner:
    """Build the runner for ``engine``; heavy engines are imported only when asked for. ``parallel``
    (a ParallelLayout) goes to every engine; one that cannot honour it raises UsageError."""
    if engine == "hf":
        from .hf import HFRunner

        return HFRunner.load(**options)
    if engine == "sglang":
        from .sglang import SGLangRunner

        return SGLangRunner.load(**options)
    if engine == "vllm":
        from .vllm import VLLMRunner

        return VLLMRunner.load(**options)
    if engine == "synthetic":
        from .synthetic import SyntheticRunner

        _one_device(engine, options.pop("parallel", ONE_DEVICE))
        return SyntheticRunner(**options)
    raise ValueError(f"unknown engine {engine!r}; choose hf, sglang, vllm or synthetic")


def follow_runner(engine: str, **options) -> None:
    """A node-rank > 0 process: join the replica node-rank 0 leads and follow its forwards; returns
    when the replica ends (a dead leader ends this process sooner, see ranks.py)."""
    parallel = options.pop("parallel")
    if engine == "hf":
        from . import hf_parallel

        return hf_parallel.follow(options, parallel)
    if engine == "vllm":
        from .vllm import VLLMRunner

        return VLLMRunner.follow(parallel=parallel, **options)
    raise UsageError(f"--engine {engine} cannot span nodes: drop --nnodes or use --engine vllm")


def _one_device(engine: str, parallel: ParallelLayout) -> None:
    if not parallel.single:
        raise UsageError(f"--engine {engine} runs one device per replica: drop the parallel flags")
