"""The sglang engine's tensor parallel, as far as a CPU can see it: the size reaches SGLang's ServerArgs and
every rank's ModelRunner, embedding rows are gathered from the ranks, and without GPUs the split is refused
in one line before anything loads (tests/gpu/test_sglang_tensor_parallel_gpu.py runs it on two GPUs)."""

from types import SimpleNamespace

import pytest
import torch

from eagle3_target.server.options import UsageError
from eagle3_target.server.parallel import ParallelLayout
from eagle3_target.server.preflight import check_parallel
from eagle3_target.server.ranks import RankSpec
from eagle3_target.server.runners.sglang import SGLangRunner
from eagle3_target.server.runners.sglang_parallel import rank_options


def test_the_tensor_parallel_size_reaches_server_args_and_each_ranks_model_runner(fake_sglang):
    for rank in range(2):
        runner = SGLangRunner.build(
            model="org/model",
            dtype="bfloat16",
            device=f"cuda:{rank}",
            tp_rank=rank,
            tp_size=2,
            aux_layer_ids=None,
            trust_remote_code=False,
            mem_fraction_static=0.5,
        )
        made = fake_sglang.model_runners[-1]
        assert (made["tp_rank"], made["tp_size"], made["gpu_id"]) == (rank, 2, rank)
        assert (made["pp_rank"], made["pp_size"]) == (0, 1)
        assert made["server_args"].tp_size == 2 and made["server_args"].base_gpu_id == 0
        assert runner.model_runner.tp_size == 2


def test_one_device_stays_one_rank(fake_sglang):
    SGLangRunner.load("org/model", dtype="bfloat16", device="cuda:1")
    made = fake_sglang.model_runners[-1]
    assert (made["tp_rank"], made["tp_size"], made["gpu_id"], made["server_args"].tp_size) == (0, 1, 1, 1)
    assert made["server_args"].base_gpu_id == 1


def test_each_rank_builds_on_its_own_gpu():
    options = {"model": "org/model", "device": "cuda", "engine": "sglang", "mem_fraction_static": 0.5}
    for rank in range(2):
        group = SimpleNamespace(spec=RankSpec(rank, 2, rank, "127.0.0.1", 1, options))
        built = rank_options(options, group)
        assert (built["device"], built["tp_rank"], built["tp_size"]) == (f"cuda:{rank}", rank, 2)
        assert "engine" not in built and built["model"] == "org/model"


def test_embedding_rows_are_gathered_from_every_rank_and_the_padding_dropped():
    runner = SGLangRunner.__new__(SGLangRunner)
    shard = torch.arange(8.0).reshape(4, 2)  # this rank's 4 of 8 padded rows
    gathered = []

    def all_gather(weight, dim):
        gathered.append(dim)
        return torch.cat([weight, weight + 100], dim=dim)

    runner.sgl = SimpleNamespace(tensor_model_parallel_all_gather=all_gather)
    embed = SimpleNamespace(weight=shard)
    model = SimpleNamespace(get_input_embeddings=lambda: embed)
    runner.model_runner = SimpleNamespace(model=model, tp_size=2)
    runner.info = SimpleNamespace(vocab_size=6)
    rows = runner.input_embeddings()
    assert gathered == [0] and rows.shape == (6, 2) and torch.equal(rows[4:], shard[:2] + 100)
    runner.model_runner.tp_size = 1
    assert torch.equal(runner.input_embeddings(), shard) and gathered == [0]


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has the GPUs a split needs")
def test_a_split_without_gpus_is_refused_in_one_line():
    with pytest.raises(UsageError, match="needs as many CUDA GPUs, and this machine has"):
        check_parallel("sglang", ParallelLayout(tensor_parallel_size=2))


@pytest.mark.parametrize("layout", [{"pipeline_parallel_size": 2}, {"tensor_parallel_size": 2, "nnodes": 2}])
def test_pipeline_parallel_and_nodes_are_refused(layout):
    with pytest.raises(UsageError, match="--engine sglang splits a replica by --tensor-parallel-size"):
        check_parallel("sglang", ParallelLayout(**layout))
