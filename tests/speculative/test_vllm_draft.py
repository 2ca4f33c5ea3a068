"""A NeMo EAGLE-3 draft exported for vLLM (server/speculative/vllm_draft.py), checked against NeMo's own export:
the layer count the weights hold (not the target's `num_hidden_layers` NeMo's config keeps), vLLM's architecture
and aux-layer numbering, the weights unchanged under vLLM's names; and the NeMo-free draft the vllm tests build
(tests/vllm_engine/eagle3_draft.py) has NeMo's layout key for key."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from speculative.draft_support import write_draft
from vllm_engine.eagle3_draft import write_eagle3_draft
from vllm_engine.vllm_support import VLLM_TINY

from eagle3_target.server.errors import InvalidInput, OutOfRange
from eagle3_target.server.runners.base import RunnerInfo
from eagle3_target.server.runners.tiny import build_tiny_llama
from eagle3_target.server.speculative import vllm_draft

CONSOLIDATED = ("model", "consolidated")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = tmp_path_factory.mktemp("target")
    build_tiny_llama(seed=3, **VLLM_TINY).save_pretrained(path)
    return path


def info(aux_layer_ids=(1, 3, 7)) -> RunnerInfo:
    return RunnerInfo.build(
        model="t",
        engine="vllm",
        num_hidden_layers=8,
        hidden_size=64,
        vocab_size=512,
        aux_layer_ids=list(aux_layer_ids),
        dtype=torch.float32,
        device="cpu",
    )


def test_the_vllm_tests_draft_has_nemos_layout(target, tmp_path):
    nemo = write_draft(target, tmp_path / "nemo").joinpath(*CONSOLIDATED)
    ours = write_eagle3_draft(target, tmp_path / "ours").joinpath(*CONSOLIDATED)
    assert _layout(ours) == _layout(nemo)
    nemo_config, our_config = (json.loads((f / "config.json").read_text()) for f in (nemo, ours))
    for name in ("architectures", "num_hidden_layers", "hidden_size", "vocab_size", "draft_vocab_size"):
        assert our_config[name] == nemo_config[name], name


def _layout(folder) -> dict:
    return {k: (v.dtype, tuple(v.shape)) for k, v in load_file(folder / "model.safetensors").items()}


@pytest.mark.parametrize("draft_vocab_size", [None, 128])
def test_a_nemo_draft_is_exported_with_the_layers_its_weights_hold(target, tmp_path, draft_vocab_size):
    extra = {} if draft_vocab_size is None else {"draft_vocab_size": draft_vocab_size}
    folder = write_draft(target, tmp_path / "ck", **extra).joinpath(*CONSOLIDATED)
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 8  # the trap
    out = vllm_draft.export(folder, info(), tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 8]  # vLLM's layer i: decoder layer i's input
    saved, exported = load_file(folder / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(exported) == {k.removeprefix("model.") for k in saved}
    assert all(torch.equal(exported[k.removeprefix("model.")], v) for k, v in saved.items())
    assert ("d2t" in exported) == (draft_vocab_size is not None)


def test_drafts_vllm_would_take_silently_are_refused(target, tmp_path):
    folder = write_eagle3_draft(target, tmp_path / "ck").joinpath(*CONSOLIDATED)
    with pytest.raises(OutOfRange, match="increasing order"):
        vllm_draft.export(folder, info((7, 3, 1)), tmp_path / "a")
    tensors = load_file(folder / "model.safetensors")
    for broken, match in (
        ({k: v for k, v in tensors.items() if k != "lm_head.weight"}, "lm_head"),
        ({k.replace("layers.0.", "layers.2."): v for k, v in tensors.items()}, "decoder layers"),
    ):
        save_file(broken, folder / "model.safetensors")
        with pytest.raises(InvalidInput, match=match):
            vllm_draft.export(folder, info(), tmp_path / "b")
