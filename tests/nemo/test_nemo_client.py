"""Compatibility with an unmodified NeMo AutoModel trainer (nemo-automodel 0.7.0, installed with --no-deps).

NeMo's own client, RemoteEagle3TargetModel, talks to our server on the wire path; NeMo's own server logic,
TargetModelServer over its co-located HFEagle3TargetModel, is the reference: same model, same requests,
and the /generate response bodies must be equal byte for byte.
"""

import asyncio

import torch
from nemo_automodel.components.speculative.eagle.remote import RemoteEagle3TargetModel
from nemo_automodel.components.speculative.eagle.remote import wire as nemo_wire
from nemo_automodel.components.speculative.eagle.remote.server import TargetModelServer
from nemo_automodel.components.speculative.eagle.target import HFEagle3TargetModel
from target_support import generate_body, serve, vocab_body
from transformers import AutoModelForCausalLM

from eagle3_target.protocol import wire
from eagle3_target.server.runners.hf import HFRunner

V = 512


def draft_vocab():
    ids = torch.randperm(V, generator=torch.Generator().manual_seed(7))[:128]
    mask = torch.zeros(V, dtype=torch.bool)
    mask[ids] = True
    return ids, mask


def batches():
    g = torch.Generator().manual_seed(11)
    for length in (16, 33):
        input_ids = torch.randint(0, V, (2, length), generator=g)
        attention_mask = torch.ones_like(input_ids)
        attention_mask[0, length - 5 :] = 0
        loss_mask = attention_mask.clone()
        loss_mask[:, :3] = 0
        yield input_ids, attention_mask, loss_mask


async def test_generate_bodies_equal_nemos_own_server_logic_byte_for_byte(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("NEMO_EAGLE_ENABLE_NCCL", "0")
    nemo = TargetModelServer(
        HFEagle3TargetModel(AutoModelForCausalLM.from_pretrained(tiny_model_dir)), nccl_port=1
    )
    ids, mask = draft_vocab()
    async with serve(lambda: HFRunner.load(tiny_model_dir)) as srv:
        body = vocab_body(ids, mask)
        assert nemo.handle_set_vocab_mapping(body) == b'{"status": "ok"}'
        resp = await srv.post("set_vocab_mapping", body)
        assert resp.status == 200
        for batch in batches():
            request = generate_body(*batch)
            expected, used_nccl = nemo.handle_generate(request, client_wants_nccl=False)
            async with srv.http.post(f"{srv.url}/generate", data=request) as resp:
                ours = await resp.read()
            assert not used_nccl and len(ours) == len(expected)
            assert ours == expected
        async with srv.http.post(f"{srv.url}/model_info", data=b"") as resp:
            info = await resp.json()
        nemo_info = __import__("json").loads(nemo.handle_model_info(b""))
        assert {k: info[k] for k in nemo_info} == nemo_info
        async with srv.http.post(f"{srv.url}/input_embeddings", data=b"") as resp:
            assert await resp.read() == nemo.handle_input_embeddings(b"")


async def test_unmodified_nemo_client_gets_the_reference_servers_batches_from_ours(
    tiny_model_dir, monkeypatch
):
    monkeypatch.setenv("NEMO_EAGLE_ENABLE_NCCL", "0")
    reference = TargetModelServer(
        HFEagle3TargetModel(AutoModelForCausalLM.from_pretrained(tiny_model_dir)), nccl_port=1
    )
    ids, mask = draft_vocab()
    reference.handle_set_vocab_mapping(vocab_body(ids, mask))
    async with serve(lambda: HFRunner.load(tiny_model_dir)) as srv:

        def trainer():
            client = RemoteEagle3TargetModel([srv.url], device=torch.device("cpu"), timeout=30, max_retries=1)
            client.set_vocab_mapping(ids, mask)
            info = client.model_info()
            weight = client.get_input_embeddings().weight
            got = []
            for input_ids, attention_mask, loss_mask in batches():
                got.append(client.generate_batch(input_ids, attention_mask, loss_mask))
                handle = client.generate_batch_async(input_ids, attention_mask, loss_mask)
                got.append(handle.result(timeout=60))
            client.close()
            return info, weight, got

        info, weight, got = await asyncio.to_thread(trainer)
        assert not srv.server.service.stopped.is_set()  # /disconnect ended the session, not the server
        assert (await srv.get("health")).status == 200

    assert info["aux_layer_ids"] == [1, 3, 4] and info["vocab_size"] == V
    assert torch.equal(
        weight, AutoModelForCausalLM.from_pretrained(tiny_model_dir).get_input_embeddings().weight
    )
    expected = []
    for batch in batches():
        body, _ = reference.handle_generate(generate_body(*batch), client_wants_nccl=False)
        expected += [nemo_wire.decode(body, map_location="cpu")] * 2
    for batch, ref in zip(got, expected, strict=False):
        for key in ("aux_hidden_states", "target_probs", "position_mask", "input_ids", "loss_mask"):
            assert torch.equal(
                getattr(batch, key), ref[key].bool() if key == "position_mask" else ref[key]
            ), key
    # What a draft's loss takes: a proper distribution over the draft vocab (training on it: tests/nemo/test_nemo_trainer.py).
    probs = got[0].target_probs
    assert probs.shape == (2, 16, 128) and torch.allclose(probs.sum(-1), torch.ones(2, 16))


def test_nemo_decodes_our_blobs_and_we_decode_nemos():
    tensors = {"a": torch.randn(3, 4).to(torch.bfloat16), "b": torch.tensor([True, False]), "c": None}
    ours = wire.encode(tensors)
    assert nemo_wire.encode_to_bytes(tensors) == ours
    back = nemo_wire.decode(ours, map_location="cpu")
    assert torch.equal(back["a"], tensors["a"]) and torch.equal(back["b"], tensors["b"]) and back["c"] is None
