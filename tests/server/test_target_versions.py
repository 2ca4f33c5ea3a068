"""Which weights a server serves: /model_info's target_version, every /generate reply's header, the metrics."""

import pytest
import torch
from safetensors.torch import load_file
from target_support import generate_body, serve, vocab_body

from eagle3_target.protocol import contract
from eagle3_target.protocol.model_info import ModelInfo, ModelInfoError
from eagle3_target.server.runners.hf import HFRunner
from eagle3_target.server.versions import weights_digest


async def model_info(server) -> dict:
    async with server.http.post(f"{server.url}/model_info", data=b"") as resp:
        return await resp.json()


async def test_the_start_up_version_is_the_digest_of_the_checkpoints_tensors(hf_server, tiny_model_dir):
    info = await model_info(hf_server)
    on_disk = load_file(f"{tiny_model_dir}/model.safetensors")
    assert info["target_version"] == weights_digest(on_disk)
    assert info["target_version"].startswith("sha256-") and len(info["target_version"]) == 7 + 16
    # NeMo's four keys still come first: a stock client reads them and ignores the rest
    assert list(info)[:4] == ["num_hidden_layers", "hidden_size", "vocab_size", "aux_layer_ids"]
    assert ModelInfo.from_json(info).target_version == info["target_version"]


def test_a_digest_changes_with_any_tensor_and_not_with_order():
    tensors = {"a": torch.arange(6.0).view(2, 3), "b": torch.ones(3, dtype=torch.bfloat16)}
    assert weights_digest(tensors) == weights_digest(dict(reversed(tensors.items())))
    changed = {**tensors, "b": torch.tensor([1.0, 1.0, 1.0078125], dtype=torch.bfloat16)}
    assert weights_digest(changed) != weights_digest(tensors)
    assert weights_digest({**tensors, "a": tensors["a"].view(3, 2)}) != weights_digest(tensors)


async def test_every_generate_reply_and_the_metrics_name_the_version(hf_server):
    version = (await model_info(hf_server))["target_version"]
    ids = torch.arange(100)
    mask = torch.zeros(512, dtype=torch.bool)
    mask[ids] = True
    assert (await hf_server.post("set_vocab_mapping", vocab_body(ids, mask))).status == 200
    reply = await hf_server.post("generate", generate_body(torch.arange(16).view(2, 8)))
    assert reply.status == 200 and reply.headers[contract.TARGET_VERSION_HEADER] == version
    features = {contract.FEATURES_HEADER: '{"layers": [1]}'}
    reply = await hf_server.post("generate", generate_body(torch.arange(16).view(2, 8)), headers=features)
    assert reply.status == 200 and reply.headers[contract.TARGET_VERSION_HEADER] == version
    async with hf_server.http.get(f"{hf_server.url}/metrics") as resp:
        text = await resp.text()
    assert f'eagle3_target_target_version_info{{version="{version}"}} 1.0' in text


async def test_two_replicas_of_one_checkpoint_report_one_version(hf_server, tiny_model_dir):
    async with serve(lambda: HFRunner.load(tiny_model_dir)) as other:
        assert (await model_info(other))["target_version"] == (await model_info(hf_server))["target_version"]


@pytest.mark.parametrize("label", ["", " v1", "v 1", "x" * 129, 7, "v1\n"])
def test_a_model_info_whose_version_is_no_version_is_refused_in_one_line(label):
    doc = {"num_hidden_layers": 8, "hidden_size": 64, "vocab_size": 512, "aux_layer_ids": [1, 3, 4]}
    with pytest.raises(ModelInfoError, match="target version") as exc:
        ModelInfo.from_json({**doc, "target_version": label})
    assert "\n" not in str(exc.value)
