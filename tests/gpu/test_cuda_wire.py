"""On a CUDA GPU: the wire path's GPU-only legs, the server's pinned host copy and the client's pinned receive.

Skipped elsewhere (no CI machine has a GPU); bench/gpu_check.py runs the same legs at 8B widths.
"""

import pytest
import torch
from target_support import generate_body, serve, vocab_body

from eagle3_target.client.body import read_tensors
from eagle3_target.protocol import encodings
from eagle3_target.protocol.supervision import VocabMapping
from eagle3_target.server.runners.hf import HFRunner
from eagle3_target.server.runners.tiny import build_tiny_llama

pytestmark = [
    pytest.mark.skip_ok_in_ci,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("encoding", ["nemo", "logits", "hidden"])
async def test_a_cuda_target_replies_with_what_its_own_device_computes_read_into_pinned_tensors(encoding):
    runner = HFRunner(build_tiny_llama(seed=1).to("cuda", torch.bfloat16), name="tiny-cuda")
    vocab_size = runner.info.vocab_size
    ids = torch.randperm(vocab_size)[: vocab_size // 2]
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[ids] = True
    input_ids = torch.randint(0, vocab_size, (2, 64))
    loss_mask = (torch.arange(64) >= 16).long().expand(2, 64).contiguous()

    on_gpu = {
        "input_ids": input_ids.cuda(),
        "loss_mask": loss_mask.cuda(),
        "vocab": VocabMapping(ids.cuda(), mask.cuda()),
    }
    logits, aux, hidden = runner.forward_hidden(on_gpu["input_ids"], torch.ones_like(on_gpu["input_ids"]))
    expected = encodings.encode(
        encoding, logits, aux, on_gpu["input_ids"], on_gpu["loss_mask"], on_gpu["vocab"], hidden
    )
    async with serve(lambda: runner) as srv:
        await srv.post("set_vocab_mapping", vocab_body(ids, mask))
        body = generate_body(input_ids, loss_mask=loss_mask)
        async with srv.http.post(
            f"{srv.url}/generate", data=body, headers={"X-Eagle3-Encoding": encoding}
        ) as resp:
            assert resp.status == 200, await resp.text()
            got = await read_tensors(resp, pin_memory=True)
    assert set(got) == set(expected)
    for key, tensor in got.items():
        assert tensor.is_pinned(), key
        assert torch.equal(tensor, expected[key].cpu()), key  # the same device's numbers, bit for bit
