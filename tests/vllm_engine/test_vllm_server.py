"""A real target server on loopback with the vllm engine: the seam end to end, model loaded off the loop;
EAGLE-3 supervision, feature requests and weights as an hf server gives them."""

import torch
from target_support import generate_body, serve, vocab_body

from eagle3_target.protocol import wire
from eagle3_target.protocol.contract import FEATURES_HEADER, SUPERVISION_KEYS
from eagle3_target.protocol.features import WEIGHT_NAMES, Features
from eagle3_target.protocol.supervision import VocabMapping, build_supervision
from eagle3_target.server.runners import load_runner

from .vllm_support import AUX_LAYER_IDS

# Any layers (-1: the embedding output), the final normed states, full logits shifted, draft_probs
FEATURES = (
    Features(layers=(-1, 5, 0), final_hidden=True, logits="full", shift=True),
    Features(layers=(2,)),
    Features(layers=(7, 1), logits="draft_probs", shift=True),
)


async def feature_replies(srv, input_ids, draft_ids, draft_mask) -> list[dict[str, torch.Tensor]]:
    """FEATURES asked of a server, on full rows (vLLM leaves padding zero where hf computes it)."""
    assert (await srv.post("set_vocab_mapping", vocab_body(draft_ids, draft_mask))).status == 200
    replies = []
    for features in FEATURES:
        headers = {FEATURES_HEADER: features.to_header()}
        async with srv.http.post(
            f"{srv.url}/generate", data=generate_body(input_ids), headers=headers
        ) as resp:
            assert resp.status == 200, await resp.text()
            replies.append(wire.decode(bytearray(await resp.read())))
    return replies


async def weights_and_packing(srv) -> dict[str, torch.Tensor]:
    """/weights/<name> for every name, and a packed request refused in one line of JSON."""
    weights = {}
    for name in WEIGHT_NAMES:
        async with srv.http.post(f"{srv.url}/weights/{name}") as resp:
            weights[name] = wire.decode(bytearray(await resp.read()))["weight"]
    ids = torch.zeros(1, 6, dtype=torch.long)
    packed = {"position_ids": torch.arange(6)[None], "seq_lens": torch.tensor([[6]])}
    body = wire.encode({"input_ids": ids, "attention_mask": ids + 1, "loss_mask": ids + 1, **packed})
    async with srv.http.post(f"{srv.url}/generate", data=body) as resp:
        assert resp.status == 400 and len((await resp.text()).splitlines()) == 1
        assert (await resp.json())["error"] == "packing_not_offered"
    return weights


async def test_generate_and_feature_requests_serve_the_hf_engines_tensors(vllm_model_dir):
    options = dict(model=vllm_model_dir, dtype="float32", device="cpu", aux_layer_ids=AUX_LAYER_IDS)
    hf = load_runner("hf", **options)
    vocab = hf.info.vocab_size
    draft_ids = torch.tensor([7, 3, 41, 0, 19, 300])
    draft_mask = torch.zeros(vocab, dtype=torch.bool)
    draft_mask[draft_ids] = True
    input_ids = torch.randint(0, vocab, (3, 21), generator=torch.Generator().manual_seed(5))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 12:] = 0
    loss_mask = attention_mask.clone()
    loss_mask[:, :4] = 0
    async with serve(lambda: load_runner("vllm", **options), wait=False) as srv:
        await srv.wait_ready(timeout=240)
        async with srv.http.post(f"{srv.url}/model_info", data=b"") as resp:
            info = await resp.json()
        assert info["engine"] == "vllm" and info["config_digest"] == hf.info.config_digest
        assert "packing" not in info["features"] and info["weights"] == list(WEIGHT_NAMES)
        got_features = await feature_replies(srv, input_ids[:, :9], draft_ids, draft_mask)
        got_weights = await weights_and_packing(srv)
        async with srv.http.post(f"{srv.url}/input_embeddings", data=b"") as resp:
            weight = wire.decode(bytearray(await resp.read()))["weight"]
        assert torch.equal(weight, hf.input_embeddings())
        async with srv.http.post(
            f"{srv.url}/generate", data=generate_body(input_ids, attention_mask, loss_mask)
        ) as resp:
            assert resp.status == 200
            out = wire.decode(bytearray(await resp.read()))
        left_padded = generate_body(input_ids, attention_mask.flip(1), loss_mask)
        async with srv.http.post(f"{srv.url}/generate", data=left_padded) as resp:
            assert resp.status == 400 and (await resp.json())["error"] == "unsupported_padding"
        async with srv.http.get(f"{srv.url}/metrics") as resp:
            assert 'engine="vllm"' in await resp.text()

    async with serve(lambda: load_runner("hf", **options)) as hf_srv:
        want_features = await feature_replies(hf_srv, input_ids[:, :9], draft_ids, draft_mask)
    for got, want in zip(got_features, want_features, strict=True):
        assert list(got) == list(want)
        for key in want:
            torch.testing.assert_close(got[key], want[key], atol=1e-4, rtol=0, msg=key)
    for name, weight in got_weights.items():
        assert torch.equal(weight, hf.weight(name)), name
    logits, aux = hf.forward(input_ids, attention_mask)
    want = build_supervision(logits, aux, input_ids, loss_mask, VocabMapping(draft_ids, draft_mask))
    assert list(out) == list(SUPERVISION_KEYS)
    real, next_real = attention_mask.bool(), torch.roll(attention_mask, -1, dims=1).bool()
    next_real[:, -1] = False
    torch.testing.assert_close(
        out["aux_hidden_states"][real], want["aux_hidden_states"][real], atol=1e-4, rtol=0
    )
    torch.testing.assert_close(
        out["target_probs"][next_real], want["target_probs"][next_real], atol=1e-4, rtol=0
    )
    for key in ("position_mask", "input_ids", "loss_mask"):
        assert torch.equal(out[key], want[key]), key
