"""On a machine with two CUDA GPUs and SGLang: the sglang engine split over both (--tensor-parallel-size 2)
answers as the hf engine does on one GPU, to bf16 tolerance, and gathers its embedding rows whole.

Skipped elsewhere (tests/sglang_runner/test_sglang_split.py checks on CPUs what reaches SGLang).
"""

import importlib.util

import pytest
import torch

from eagle3_target.server.parallel import ParallelLayout
from eagle3_target.server.runners.hf import HFRunner
from eagle3_target.server.runners.tiny import build_tiny_llama

pytestmark = [
    pytest.mark.skip_ok_in_ci,
    pytest.mark.skipif(
        importlib.util.find_spec("sglang") is None or torch.cuda.device_count() < 2,
        reason="needs SGLang and two CUDA GPUs",
    ),
]


def test_sglang_tensor_parallel_2_answers_as_one_gpu_does(tmp_path):
    from eagle3_target.server.runners import load_runner

    # head_dim 64 and 4 heads: kernels for every backend, and heads both ranks can share
    build_tiny_llama(seed=1, hidden_size=256, intermediate_size=512).save_pretrained(tmp_path)
    ids = torch.randint(0, 512, (3, 40), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(40) < torch.tensor([40, 23, 7])[:, None]).long()
    hf = HFRunner.load(str(tmp_path), dtype="bfloat16", device="cuda:0")
    h_logits, h_aux = (t.cpu().float() for t in hf.forward(ids.cuda(), mask.cuda()))
    h_embed = hf.input_embeddings().cpu()
    hf.close()
    split = load_runner(
        "sglang",
        model=str(tmp_path),
        dtype="bfloat16",
        device="cuda",
        parallel=ParallelLayout(tensor_parallel_size=2),
    )
    try:
        assert split.info.parallel["tensor_parallel_size"] == 2
        s_logits, s_aux = (t.cpu().float() for t in split.forward(ids, mask))
        assert torch.equal(split.input_embeddings().cpu(), h_embed)
    finally:
        split.close()
    torch.testing.assert_close(s_logits, h_logits, atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(s_aux, h_aux, atol=5e-2, rtol=5e-2)
