"""On a machine with two CUDA GPUs: the hf engine split over both (NCCL, one GPU per rank) answers as one GPU
does, within 1e-4 in float32 (tests/parallel/test_hf_tensor_parallel.py is the same check on CPUs, gloo).

Skipped elsewhere; bench/gpu_check.py --tensor-parallel-size 2 measures the same layout's tokens/s.
"""

import pytest
import torch
from parallel_support import assert_close, replies, write_split_llama
from target_support import TargetProcess

pytestmark = [
    pytest.mark.skip_ok_in_ci,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"),
]


def test_tensor_parallel_2_on_two_gpus_answers_as_one_gpu(tmp_path):
    model = str(write_split_llama(tmp_path / "model"))
    flags = ["--model", model, "--device", "cuda", "--dtype", "float32"]
    one = TargetProcess("127.0.0.1", *flags).wait_ready(300)
    try:
        reference = replies(one.url)
    finally:
        one.kill()
    split = TargetProcess("127.0.0.1", *flags, "--tensor-parallel-size", "2").wait_ready(300)
    try:
        assert_close(replies(split.url), reference)
    finally:
        split.kill()
