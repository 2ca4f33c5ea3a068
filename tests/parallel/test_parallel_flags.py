"""The layouts each engine refuses, one line each before anything loads (server/preflight.py check_parallel)."""

import pytest
from parallel_support import SPLIT_LLAMA, refused_line
from transformers import LlamaConfig

from eagle3_target.server.options import UsageError
from eagle3_target.server.parallel import ParallelLayout
from eagle3_target.server.preflight import check_parallel

CONFIG = LlamaConfig(
    **{**SPLIT_LLAMA, "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 4}
)

CONFIG_THREE_WAY = LlamaConfig(
    **{**SPLIT_LLAMA, "hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 3}
)


def refusal(engine: str, config=CONFIG, **layout) -> str:
    with pytest.raises(UsageError) as error:
        check_parallel(engine, ParallelLayout(**layout), config)
    return str(error.value)


def test_one_device_passes_every_engine():
    for engine in ("hf", "vllm", "sglang", "synthetic"):
        check_parallel(engine, ParallelLayout(), CONFIG)


def test_what_each_engine_honours_passes():
    check_parallel("hf", ParallelLayout(tensor_parallel_size=2), CONFIG)
    check_parallel("hf", ParallelLayout(tensor_parallel_size=2, nnodes=2, node_rank=1), CONFIG)
    check_parallel("hf", ParallelLayout(pipeline_parallel_size=4, nnodes=2), CONFIG)
    check_parallel("vllm", ParallelLayout(tensor_parallel_size=2, pipeline_parallel_size=4, nnodes=2), CONFIG)


def test_a_tensor_parallel_size_that_splits_no_heads_names_both_counts():
    line = refusal("hf", tensor_parallel_size=4)  # divides 8 heads, not 2 KV heads
    assert "--tensor-parallel-size 4" in line and "8 attention heads" in line and "2 key-value heads" in line


def test_vllm_may_copy_kv_heads_over_more_ranks_than_it_has():
    check_parallel("vllm", ParallelLayout(tensor_parallel_size=4), CONFIG)  # 2 KV heads, each on 2 ranks
    assert "3 key-value heads" in refusal("vllm", CONFIG_THREE_WAY, tensor_parallel_size=2)  # 6 heads, 3 KV


def test_pipeline_parallel_beyond_the_layers_is_refused():
    assert "larger than the model's 4 layers" in refusal("vllm", pipeline_parallel_size=5)


def test_hf_splits_one_way_at_a_time():
    line = refusal("hf", tensor_parallel_size=2, pipeline_parallel_size=2)
    assert "--engine hf splits a model one way at a time" in line
    assert "larger than the model's 4 layers" in refusal("hf", pipeline_parallel_size=5)


def test_the_single_device_engine_refuses_any_split():
    for layout in ({"tensor_parallel_size": 2}, {"nnodes": 2}):
        assert "--engine synthetic runs one device per replica" in refusal("synthetic", **layout)


@pytest.mark.parametrize("rank", [-1, 2])
def test_a_node_rank_outside_the_nodes_is_refused(rank):
    assert f"--node-rank {rank} is outside 0..1" in refusal("vllm", nnodes=2, node_rank=rank)


def test_nodes_must_share_the_ranks_evenly():
    assert "--nnodes 2 does not divide the replica's 3 ranks" in refusal(
        "vllm", CONFIG_THREE_WAY, tensor_parallel_size=3, nnodes=2
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--tensor-parallel-size", "3"],
            "must divide both the model's 4 attention heads and its 2 key-value",
        ),
        (
            ["--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"],
            "--engine hf splits a model one way at a time",
        ),
        (["--engine", "synthetic", "--nnodes", "2"], "--engine synthetic runs one device per replica"),
        (["--nnodes", "2", "--node-rank", "2"], "--node-rank 2 is outside 0..1"),
    ],
)
def test_serve_refuses_in_one_line_with_exit_code_2(args, message):
    assert message in refused_line(*args)
