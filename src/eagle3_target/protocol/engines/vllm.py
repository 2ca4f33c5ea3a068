"""vLLM (server/runners/vllm.py, docs/vllm.md): its own executor splits a replica, tensor and pipeline parallel
at once, over one node or several."""

from ..engine_spec import PIPELINE, TENSOR, Engine

ENGINE = Engine(
    name="vllm",
    summary="vLLM",
    load="eagle3_target.server.runners.vllm:VLLMRunner.load",
    load_split="eagle3_target.server.runners.vllm:VLLMRunner.load",  # vLLM starts its ranks itself
    splits=frozenset({TENSOR, PIPELINE}),
    both_at_once=True,
    nodes=True,
    follow="eagle3_target.server.runners.vllm:VLLMRunner.follow",
    options=("trust_remote_code", "gpu_memory_utilization", "max_batch_tokens"),
    package="vllm",
    copies_kv_heads=True,
)
