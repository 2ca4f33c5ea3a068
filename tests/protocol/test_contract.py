"""The torch-free contract: the token-file rule and /model_info as server and client read it."""

import dataclasses
import subprocess
import sys

import pytest

from eagle3_target.protocol import contract
from eagle3_target.protocol.model_info import ModelInfo, ModelInfoError, config_digest

FULL = {
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "vocab_size": 128256,
    "aux_layer_ids": [1, 15, 28],
    "model": "/models/llama",
    "engine": "hf",
    "dtype": "bfloat16",
    "config_digest": "0123456789abcdef",
    "encodings": ["nemo", "logits"],
    "nccl_port": 8101,
    "p2p": {"backend": "nccl", "port_range": [8101, 8164]},
}


def test_contract_and_model_info_import_without_torch():
    code = (
        "import sys; import eagle3_target.protocol.contract, eagle3_target.protocol.model_info; "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize("content", ["", "  \n\t\n"])
def test_an_empty_token_file_is_an_error(tmp_path, content):
    path = tmp_path / "token"
    path.write_text(content)
    with pytest.raises(contract.TokenFileError, match=f"{path} is empty"):
        contract.read_token_file(path)


def test_an_unreadable_token_file_is_an_error(tmp_path):
    with pytest.raises(contract.TokenFileError, match="cannot read it"):
        contract.read_token_file(tmp_path / "missing")
    (tmp_path / "binary").write_bytes(b"\xff\xfe")
    with pytest.raises(contract.TokenFileError, match="cannot read it"):
        contract.read_token_file(tmp_path / "binary")


def test_the_token_is_stripped_and_the_environment_names_its_file(tmp_path, monkeypatch):
    path = tmp_path / "token"
    path.write_text("  s3cret\n")
    assert contract.read_token_file(path) == "s3cret"
    monkeypatch.delenv(contract.TOKEN_FILE_ENV, raising=False)
    assert contract.token_from_env() is None
    monkeypatch.setenv(contract.TOKEN_FILE_ENV, str(path))
    assert contract.token_from_env() == "s3cret"
    path.write_text("\n")
    with pytest.raises(contract.TokenFileError, match=f"\\${contract.TOKEN_FILE_ENV}={path} is empty"):
        contract.token_from_env()


def test_model_info_round_trips_and_keeps_nemo_keys_first():
    info = ModelInfo.from_json(FULL)
    assert info.aux_layer_ids == (1, 15, 28) and info.p2p["backend"] == "nccl"
    assert info.to_json() == FULL
    assert list(info.to_json())[:4] == ["num_hidden_layers", "hidden_size", "vocab_size", "aux_layer_ids"]


def test_a_stock_nemo_server_reports_four_keys_and_unknown_keys_are_ignored():
    doc = {k: FULL[k] for k in ("num_hidden_layers", "hidden_size", "vocab_size", "aux_layer_ids")}
    info = ModelInfo.from_json({**doc, "something_new": 1})
    assert info.encodings is None and info.dtype is None and info.p2p == {}
    assert info.to_json() == doc
    assert list(info.identity()) == list(doc)


@pytest.mark.parametrize(
    "doc, message",
    [
        ([1, 2], "not a JSON object"),
        ({"num_hidden_layers": 2}, "lacks hidden_size, vocab_size, aux_layer_ids"),
        ({**FULL, "hidden_size": "4096"}, "hidden_size is not an integer"),
        ({**FULL, "vocab_size": True}, "vocab_size is not an integer"),
        ({**FULL, "aux_layer_ids": 3}, "malformed"),
        ({**FULL, "p2p": "nccl"}, "p2p is not an object"),
    ],
)
def test_a_malformed_model_info_says_what_is_wrong(doc, message):
    with pytest.raises(ModelInfoError, match=message):
        ModelInfo.from_json(doc)


def test_difference_names_the_identity_fields_that_differ_and_nothing_else():
    ours = ModelInfo.from_json(FULL)
    renamed = dataclasses.replace(ours, model="/other/path", engine="vllm", nccl_port=9000, p2p={})
    assert ours.difference(renamed) == []  # names and per-server facts may differ
    other = dataclasses.replace(ours, hidden_size=2048, dtype="float16")
    assert ours.difference(other) == [
        "hidden_size: 2048 (expected 4096)",
        "dtype: float16 (expected bfloat16)",
    ]
    stock = ModelInfo(32, 4096, 128256, (1, 15, 28))  # reports no dtype: compared on what both report
    assert ours.difference(stock) == []
    assert ours.difference(dataclasses.replace(stock, aux_layer_ids=(2, 15, 28))) == [
        "aux_layer_ids: [2, 15, 28] (expected [1, 15, 28])"
    ]
    assert "aux_layer_ids=[1, 15, 28]" in ours.describe() and "dtype=bfloat16" in ours.describe()


def test_a_sub_configs_dtype_is_not_digested_either():
    """A vision-language config as a trainer reads it and as a float32 load leaves it: one digest."""
    read = {"model_type": "qwen2_5_vl", "text_config": {"hidden_size": 64}, "vision_config": {"depth": 2}}
    loaded = {
        "model_type": "qwen2_5_vl",
        "dtype": "float32",
        "text_config": {"hidden_size": 64, "dtype": "float32"},
        "vision_config": {"depth": 2, "dtype": "float32"},
    }
    assert config_digest(read) == config_digest(loaded)
    assert config_digest(read) != config_digest({**read, "text_config": {"hidden_size": 32}})


def test_the_config_digest_is_the_models_not_the_librarys():
    """A fleet on one transformers and a trainer on NeMo's pinned 5.18.0 read one config alike."""
    config = {"model_type": "llama", "num_hidden_layers": 8, "transformers_version": "5.24.0"}
    same = {**config, "transformers_version": "5.18.0", "_name_or_path": "/elsewhere", "dtype": "float32"}
    assert config_digest(config) == config_digest(same)
    assert config_digest(config) != config_digest({**config, "num_hidden_layers": 9})
