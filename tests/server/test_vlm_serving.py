"""Image-text checkpoints (a tiny random Qwen2.5-VL): the hf engine serves them and says so in /model_info;
the vllm and sglang engines refuse them in one line before anything loads."""

from __future__ import annotations

import json

import pytest
from transformers import Qwen2_5_VLConfig
from vlm_target import write_vlm_target

from eagle3_target.protocol.features import CAN_PACKING
from eagle3_target.server.runners.hf import HFRunner

from .test_cli import http, refused, serving


@pytest.fixture(scope="module")
def vlm(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("qwen2_5_vl")
    write_vlm_target(path)
    return str(path)


@pytest.mark.parametrize("split", [["--tensor-parallel-size", "2"], ["--pipeline-parallel-size", "2"]])
def test_a_split_vlm_replica_is_refused_before_loading(split, tmp_path):
    Qwen2_5_VLConfig().save_pretrained(tmp_path)
    line = refused("--engine", "hf", "--model", str(tmp_path), *split)
    assert (
        "is an image-text model (qwen2_5_vl); a replica split over ranks serves text-only targets" in line
    ), line


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_engines_without_image_text_support_refuse_a_vlm_before_loading(engine, tmp_path):
    Qwen2_5_VLConfig().save_pretrained(tmp_path)  # the config alone decides; no weights to load
    line = refused("--engine", engine, "--model", str(tmp_path))
    assert f"is an image-text model (qwen2_5_vl); --engine {engine} serves text-only targets" in line


def test_the_hf_runner_loads_an_image_text_checkpoint_with_its_language_models_sizes(vlm):
    runner = HFRunner.load(vlm, dtype="float32")
    doc = runner.info.model_info().to_json()
    assert doc["modalities"] == ["text", "image"]
    assert (doc["num_hidden_layers"], doc["hidden_size"], doc["vocab_size"]) == (8, 64, 1000)
    assert CAN_PACKING not in doc["features"]  # multimodal RoPE: packed rows are refused


def test_a_text_only_target_reports_no_modalities():
    assert "modalities" not in HFRunner.load(None).info.model_info().to_json()


def test_serve_hf_serves_a_vlm_and_lists_its_modalities(vlm):
    proc, _port, url = serving("--engine", "hf", "--model", vlm)
    try:
        status, body = http("POST", f"{url}/model_info", b"")
        assert status == 200 and json.loads(body)["modalities"] == ["text", "image"]
    finally:
        proc.kill()
        proc.wait()


def test_a_non_positive_image_budget_is_refused_before_loading():
    assert "--max-image-tokens" in refused("--max-image-tokens", "0")
