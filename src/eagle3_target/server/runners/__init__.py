"""Target runners: one frozen model forward behind a small engine-agnostic seam."""

from .base import HiddenStateRunner, RunnerInfo, TargetRunner, resolve_dtype

__all__ = ["HiddenStateRunner", "RunnerInfo", "TargetRunner", "resolve_dtype", "load_runner"]


def load_runner(engine: str, **options) -> TargetRunner:
    """Build the runner for ``engine``; heavy engines are imported only when asked for."""
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

        return SyntheticRunner(**options)
    raise ValueError(f"unknown engine {engine!r}; choose hf, sglang, vllm or synthetic")
