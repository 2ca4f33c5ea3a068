"""POST /weights/refresh on a vllm replica: vLLM's own in-place reload serves the new weights as the hf engine
computes them, back again bit for bit as before, and a source of another shape is refused before anything that
serves changes."""

import torch
from target_support import serve, vocab_body

from eagle3_target.protocol.supervision import VocabMapping, build_supervision
from eagle3_target.server.options import ServerOptions
from eagle3_target.server.runners import load_runner
from eagle3_target.server.runners.tiny import build_tiny_llama

from .vllm_support import ADMIN, AUX_LAYER_IDS, VLLM_TINY, batch, draft_vocab, refresh, served

IDS, MASK, LOSS = batch(3, 20, [20, 11, 16], seed=6)
VOCAB = draft_vocab(64, seed=6)


async def test_a_vllm_replica_refreshes_in_place_as_the_hf_engine_computes_the_new_weights(
    vllm_model_dir, tmp_path
):
    weights_b, other = tmp_path / "b", tmp_path / "other-shapes"
    build_tiny_llama(seed=4, **VLLM_TINY).save_pretrained(weights_b)
    build_tiny_llama(seed=4, hidden_size=32, **VLLM_TINY).save_pretrained(other)
    options = dict(model=vllm_model_dir, dtype="float32", device="cpu", aux_layer_ids=AUX_LAYER_IDS)
    server_options = ServerOptions(admin_token=ADMIN)
    async with serve(lambda: load_runner("vllm", **options), server_options, wait=False) as srv:
        await srv.wait_ready(timeout=240)
        mapping = vocab_body(VOCAB.selected_token_ids, VOCAB.selected_token_mask)
        assert (await srv.post("set_vocab_mapping", mapping)).status == 200
        started, before = await served(srv, IDS, MASK, LOSS)
        status, refused = await refresh(srv, other, "v-other")
        assert status == 400 and refused["error"] == "source_mismatch", refused
        version, kept = await served(srv, IDS, MASK, LOSS)
        assert version == started and all(torch.equal(kept[k], v) for k, v in before.items()), "unchanged"
        assert await refresh(srv, weights_b, "v-b") == (200, {"version": "v-b"})
        version, after = await served(srv, IDS, MASK, LOSS)
        assert version == "v-b"
        assert await refresh(srv, vllm_model_dir, "v-a") == (200, {"version": "v-a"})
        version, again = await served(srv, IDS, MASK, LOSS)
        assert version == "v-a"
        for key, value in before.items():
            assert torch.equal(again[key], value), key
    hf = load_runner("hf", **{**options, "model": str(weights_b)})
    logits, aux = hf.forward(IDS, MASK)
    want = build_supervision(
        logits, aux, IDS, LOSS, VocabMapping(VOCAB.selected_token_ids, VOCAB.selected_token_mask)
    )
    real = MASK.bool()
    torch.testing.assert_close(
        after["aux_hidden_states"][real], want["aux_hidden_states"][real], atol=1e-4, rtol=0
    )
    assert not torch.allclose(after["aux_hidden_states"][real], before["aux_hidden_states"][real], atol=1e-2)
