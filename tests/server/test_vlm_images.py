"""Images on the wire: a feature request to an image-text target (a tiny random Qwen2.5-VL, CPU float32) carries
pixel_values (bfloat16, as NeMo's data pipeline casts them), image_grid_thw and mm_token_type_ids; the reply
is NeMo's co-located ViSpec target wrapper's tensors bit for bit, and each malformed image input is a 4xx with
a JSON body after which the server keeps serving."""

from __future__ import annotations

import json

import pytest
import torch
from nemo_automodel.components.speculative.eagle.vispec_target import HFVispecTargetModel
from target_support import serve
from vlm_target import PER_IMAGE, SEQ, image_batch, make_vlm_data

from eagle3_target.protocol import capture, wire
from eagle3_target.protocol.contract import FEATURES_HEADER
from eagle3_target.protocol.features import LOGITS_FULL, Features
from eagle3_target.server.options import ServerOptions
from eagle3_target.server.runners.hf import HFRunner
from eagle3_target.server.runners.tiny import build_tiny_llama

# ViSpec stage 2's request: the merged embedding output, the post-norm hidden, logits and image mask shifted.
VISPEC = Features(layers=(-1,), final_hidden=True, logits=LOGITS_FULL, shift=True, image_mask=True)


@pytest.fixture(scope="module")
def vlm():
    return make_vlm_data().build_tiny_qwen2_5_vl()


async def ask(srv, body: dict[str, torch.Tensor], features: Features | None = VISPEC):
    headers = {} if features is None else {FEATURES_HEADER: features.to_header()}
    async with srv.http.post(f"{srv.url}/generate", data=wire.encode(body), headers=headers) as resp:
        raw = await resp.read()
        return resp.status, (wire.decode(bytearray(raw)) if resp.status == 200 else json.loads(raw))


async def test_a_vispec_capture_with_images_is_nemos_wrapper_bit_for_bit(vlm):
    body = image_batch(vlm)
    assert body["pixel_values"].dtype == torch.bfloat16
    images = {k: body[k] for k in ("pixel_values", "image_grid_thw", "mm_token_type_ids")}
    want = HFVispecTargetModel(vlm, image_token_id=vlm.config.image_token_id).generate_batch(
        body["input_ids"], body["attention_mask"], body["loss_mask"], **images
    )
    async with serve(lambda: HFRunner(vlm, name="vlm")) as srv:
        status, got = await ask(srv, body)
    assert status == 200, got
    assert list(got) == ["hidden_states", "final_hidden", "logits", "image_mask"]
    assert torch.equal(capture.shift_left(got["hidden_states"]), want.inputs_embeds)
    assert torch.equal(got["final_hidden"], want.input_hidden_states)
    assert torch.equal(got["logits"], want.target_logits)
    assert torch.equal(got["image_mask"], want.image_mask)
    # the images moved the merged embedding: it is not the token embedding alone
    assert not torch.equal(got["hidden_states"], vlm.get_input_embeddings()(body["input_ids"]))


def mutations(model):
    """(name, body, features, status, error) for each malformed image input."""
    good = image_batch(model)
    few_tokens = dict(good, input_ids=good["input_ids"].clone())
    few_tokens["input_ids"][0, 3] = 10
    packed = dict(good, position_ids=torch.arange(SEQ).repeat(2, 1), seq_lens=torch.tensor([[SEQ], [SEQ]]))
    return [
        (
            "patches",
            dict(good, pixel_values=good["pixel_values"][:-1]),
            VISPEC,
            400,
            "image_patches_mismatch",
        ),
        ("tokens", few_tokens, VISPEC, 400, "image_tokens_mismatch"),
        ("pixel dtype", dict(good, pixel_values=good["pixel_values"].long()), VISPEC, 400, "bad_images"),
        ("pixel shape", dict(good, pixel_values=good["pixel_values"][:, :100]), VISPEC, 400, "bad_images"),
        ("grid dtype", dict(good, image_grid_thw=good["image_grid_thw"].float()), VISPEC, 400, "bad_images"),
        ("grid shape", dict(good, image_grid_thw=good["image_grid_thw"][:, :2]), VISPEC, 400, "bad_images"),
        (
            "types shape",
            dict(good, mm_token_type_ids=good["mm_token_type_ids"][:, :3]),
            VISPEC,
            400,
            "bad_images",
        ),
        ("no grid", {k: v for k, v in good.items() if k != "image_grid_thw"}, VISPEC, 400, "bad_images"),
        ("no features", good, None, 400, "images_without_features"),
        ("packing", packed, VISPEC, 400, "images_with_packing"),
        ("budget", image_batch(model, images_per_row=2), VISPEC, 413, "too_many_image_tokens"),
    ]


async def test_each_malformed_image_input_is_a_4xx_and_the_server_keeps_serving(vlm):
    options = ServerOptions(max_image_tokens=2 * PER_IMAGE)  # one image a row fits, two do not
    async with serve(lambda: HFRunner(vlm, name="vlm"), options) as srv:
        for name, body, features, status, error in mutations(vlm):
            got_status, doc = await ask(srv, body, features)
            assert (got_status, doc.get("error")) == (status, error), (name, doc)
            assert doc.get("detail"), name
            ok, _ = await ask(srv, image_batch(vlm))
            assert ok == 200, f"the server stopped serving after {name}"


async def test_images_sent_to_a_text_only_target_are_refused(vlm):
    body = image_batch(vlm)
    body["input_ids"] = body["input_ids"] % 500  # inside the tiny Llama's vocabulary
    async with serve(lambda: HFRunner(build_tiny_llama(), name="llama")) as srv:
        status, doc = await ask(srv, body, Features(final_hidden=True))
        assert (status, doc["error"]) == (400, "images_not_accepted")
        text_only = {k: body[k] for k in ("input_ids", "attention_mask", "loss_mask")}
        assert (await ask(srv, text_only, Features(final_hidden=True)))[0] == 200


def test_a_feature_request_without_an_image_mask_reads_as_before():
    """Stock clients and earlier servers see the same header: image_mask appears only when asked."""
    assert "image_mask" not in Features(final_hidden=True).to_header()
    assert Features.from_header(VISPEC.to_header()) == VISPEC
