"""The server side of the supervision encodings: /model_info, /generate's encoding header, /lm_head."""

import torch
from target_support import generate_body, serve, vocab_body
from transformers import Gemma2Config, Gemma2ForCausalLM

from eagle3_target.protocol import encodings, wire
from eagle3_target.protocol.contract import ENCODING_HEADER, SUPERVISION_KEYS
from eagle3_target.server.runners.hf import HFRunner
from eagle3_target.server.runners.tiny import build_tiny_llama

V = 512


def draft_vocab(n=100):
    ids = torch.randperm(V, generator=torch.Generator().manual_seed(5))[:n]
    mask = torch.zeros(V, dtype=torch.bool)
    mask[ids] = True
    return ids, mask


def tiny_gemma2() -> Gemma2ForCausalLM:
    """A tiny Gemma 2: its logits are softcapped after the lm_head."""
    config = Gemma2Config(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        final_logit_softcapping=30.0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Gemma2ForCausalLM(config).eval()


async def generate(srv, input_ids, encoding=None):
    headers = {ENCODING_HEADER: encoding} if encoding else {}
    async with srv.http.post(f"{srv.url}/generate", data=generate_body(input_ids), headers=headers) as resp:
        body = await resp.read()
        return resp.status, resp.headers.get(ENCODING_HEADER), body


async def test_model_info_lists_encodings_and_lm_head_serves_the_draft_rows():
    model = build_tiny_llama()
    async with serve(lambda: HFRunner(model, name="tiny")) as srv:
        async with srv.http.post(f"{srv.url}/model_info") as resp:
            assert (await resp.json())["encodings"] == ["nemo", "logits", "hidden"]
        assert (await srv.post("lm_head")).status == 409  # no mapping yet: no rows to give
        ids, mask = draft_vocab()
        await srv.post("set_vocab_mapping", vocab_body(ids, mask))
        async with srv.http.post(f"{srv.url}/lm_head") as resp:
            rows = wire.decode(bytearray(await resp.read()))["weight"]
        assert torch.equal(rows, model.lm_head.weight[ids])


async def test_generate_sends_the_encoding_asked_for_and_says_so():
    async with serve(lambda: HFRunner(build_tiny_llama(), name="tiny")) as srv:
        await srv.post("set_vocab_mapping", vocab_body(*draft_vocab()))
        input_ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
        sizes = {}
        for encoding in (None, *encodings.ENCODINGS):
            status, echoed, body = await generate(srv, input_ids, encoding)
            assert status == 200 and echoed == (encoding or "nemo")
            want = encodings.expected(echoed, 2, 9, 64, 100, torch.float32)
            got = wire.decode(bytearray(body))
            assert list(got) == list(want)
            encodings.check(got, want)
            sizes[encoding] = len(body)
        assert sizes[None] == sizes["nemo"] > sizes["logits"] > sizes["hidden"]


async def test_an_unknown_encoding_is_a_400_and_the_server_keeps_serving():
    async with serve(lambda: HFRunner(build_tiny_llama(), name="tiny")) as srv:
        await srv.post("set_vocab_mapping", vocab_body(*draft_vocab()))
        status, _, body = await generate(srv, torch.zeros(1, 4, dtype=torch.long), "zstd")
        assert status == 400 and b"encoding_not_offered" in body and b"nemo, logits, hidden" in body
        assert (await generate(srv, torch.zeros(1, 4, dtype=torch.long)))[0] == 200


async def test_a_softcapped_target_never_offers_hidden_and_logits_stays_exact():
    model = tiny_gemma2()
    runner = HFRunner(model, name="tiny-gemma2")
    assert runner.info.encodings == ("nemo", "logits")
    input_ids = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(2))
    ones = torch.ones_like(input_ids)
    logits, _, hidden = runner.forward_hidden(input_ids, ones)
    assert not torch.allclose(logits, model.lm_head(hidden))  # the softcap is real: logits != lm_head(hidden)
    async with serve(lambda: runner) as srv:
        async with srv.http.post(f"{srv.url}/model_info") as resp:
            assert (await resp.json())["encodings"] == ["nemo", "logits"]
        ids, mask = draft_vocab()
        await srv.post("set_vocab_mapping", vocab_body(ids, mask))
        status, _, body = await generate(srv, input_ids, "hidden")
        assert status == 400 and b"encoding_not_offered" in body
        assert (await srv.post("lm_head")).status == 400
        nemo = wire.decode(bytearray((await generate(srv, input_ids))[2]))
        compact = wire.decode(bytearray((await generate(srv, input_ids, "logits"))[2]))
    got = encodings.decode("logits", compact, input_ids, ones)
    for key in SUPERVISION_KEYS:
        assert torch.equal(got[key], nemo[key]), key
