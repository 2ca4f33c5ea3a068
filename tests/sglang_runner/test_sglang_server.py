"""A real target server on loopback with the sglang engine (fake SGLang): the seam end to end."""

import torch
from target_support import generate_body, serve, spec_reference, vocab_body

from eagle3_target.protocol import wire
from eagle3_target.protocol.contract import SUPERVISION_KEYS
from eagle3_target.server.runners import load_runner


def loader():
    return load_runner("sglang", model="org/fake-model", dtype="float32", device="cuda:0", aux_layer_ids=None)


async def test_generate_serves_the_sglang_supervision(fake_sglang):
    vocab = fake_sglang.vocab
    draft_ids = torch.tensor([7, 3, 41, 0, 19])
    draft_mask = torch.zeros(vocab, dtype=torch.bool)
    draft_mask[draft_ids] = True
    input_ids = torch.randint(0, vocab, (2, 9), generator=torch.Generator().manual_seed(5))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, 6:] = 0
    loss_mask = attention_mask.clone()
    loss_mask[:, :2] = 0
    async with serve(loader) as srv:
        async with srv.http.post(f"{srv.url}/model_info", data=b"") as resp:
            info = await resp.json()
        assert info["engine"] == "sglang" and info["vocab_size"] == vocab
        async with srv.http.post(f"{srv.url}/input_embeddings", data=b"") as resp:
            weight = wire.decode(bytearray(await resp.read()))["weight"]
        assert weight.shape == (vocab, fake_sglang.hidden)
        assert (await srv.post("set_vocab_mapping", vocab_body(draft_ids, draft_mask))).status == 200
        body = generate_body(input_ids, attention_mask, loss_mask)
        async with srv.http.post(f"{srv.url}/generate", data=body) as resp:
            assert resp.status == 200
            out = wire.decode(bytearray(await resp.read()))
        runner = srv.server.service.model.runner
        logits, aux = runner.forward(input_ids, attention_mask)

        left_padded = attention_mask.flip(1)
        async with srv.http.post(f"{srv.url}/generate", data=generate_body(input_ids, left_padded)) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"] == "unsupported_padding"
        assert (await srv.post("heartbeat")).status == 200

    ref = spec_reference(logits, aux, input_ids, loss_mask, draft_ids, draft_mask)
    assert list(out) == list(SUPERVISION_KEYS)
    for key in SUPERVISION_KEYS:
        torch.testing.assert_close(out[key], ref[key], msg=key)
    assert not out["aux_hidden_states"][0, 6:].any()
