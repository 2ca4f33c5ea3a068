"""On a CUDA GPU with SGLang installed: the sglang engine agrees with the HF engine on the same checkpoint.

Skipped everywhere else. It has never run (see docs/sglang.md): no GPU was lent while it was written.
"""

import importlib.util

import pytest
import torch

from eagle3_target.server.runners.hf import HFRunner
from eagle3_target.server.runners.tiny import build_tiny_llama

pytestmark = [
    pytest.mark.skip_ok_in_ci,
    pytest.mark.skipif(
        importlib.util.find_spec("sglang") is None or not torch.cuda.is_available(),
        reason="needs SGLang and a CUDA GPU",
    ),
]


@pytest.fixture(scope="module")
def runners(tmp_path_factory):
    from eagle3_target.server.runners.sglang import SGLangRunner

    path = tmp_path_factory.mktemp("tiny-llama-gpu")
    # head_dim 64: a size every SGLang attention backend has kernels for.
    build_tiny_llama(seed=1, hidden_size=256, intermediate_size=512).save_pretrained(path)
    sgl = SGLangRunner.load(str(path), dtype="bfloat16", device="cuda:0")
    hf = HFRunner.load(str(path), dtype="bfloat16", device="cuda:0")
    yield sgl, hf
    sgl.close()
    hf.close()


def test_logits_and_aux_states_match_the_hf_engine(runners):
    sgl, hf = runners
    assert sgl.info.aux_layer_ids == hf.info.aux_layer_ids
    lengths = [40, 23, 7]
    ids = torch.randint(0, sgl.info.vocab_size, (3, 40), generator=torch.Generator().manual_seed(0)).cuda()
    mask = (torch.arange(40) < torch.tensor(lengths)[:, None]).long().cuda()
    s_logits, s_aux = sgl.forward(ids, mask)
    h_logits, h_aux = hf.forward(ids, mask)
    assert s_logits.shape == h_logits.shape and s_aux.shape == h_aux.shape
    for b, n in enumerate(lengths):
        torch.testing.assert_close(s_logits[b, :n].float(), h_logits[b, :n].float(), atol=5e-2, rtol=5e-2)
        torch.testing.assert_close(s_aux[b, :n].float(), h_aux[b, :n].float(), atol=5e-2, rtol=5e-2)
        agree = (s_logits[b, :n].argmax(-1) == h_logits[b, :n].argmax(-1)).float().mean()
        assert agree >= 0.95, f"row {b}: top-1 agrees on {agree:.0%} of positions"
        assert not s_logits[b, n:].any() and not s_aux[b, n:].any()


def test_input_embeddings_match_the_hf_engine(runners):
    sgl, hf = runners
    assert torch.equal(sgl.input_embeddings(), hf.input_embeddings())


def test_repeated_forwards_do_not_grow_gpu_memory(runners):
    sgl, _ = runners
    ids = torch.randint(0, sgl.info.vocab_size, (4, 64), device="cuda")
    sgl.forward(ids, torch.ones_like(ids))
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(5):
        sgl.forward(ids, torch.ones_like(ids))
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= before
