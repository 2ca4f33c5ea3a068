"""/model_info's reader and writer field by field, the config digest and the aux-layer rules (protocol/model_info.py)."""

import pathlib
import re
import types

import pytest

from eagle3_target.protocol.model_info import (
    ModelInfo,
    ModelInfoError,
    config_digest,
    default_aux_layer_ids,
    defining_config,
    validate_aux_layer_ids,
)

NEMO = {"num_hidden_layers": 32, "hidden_size": 4096, "vocab_size": 128256, "aux_layer_ids": [1, 15, 28]}


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("aux_layer_ids", [1, "15", 28], "/model_info aux_layer_ids is not an integer: '15'"),
        ("aux_layer_ids", [1, 15.0, 28], "/model_info aux_layer_ids is not an integer: 15.0"),
        ("nccl_port", "8101", "/model_info nccl_port is not an integer: '8101'"),
        ("nccl_port", False, "/model_info nccl_port is not an integer: False"),
        ("num_hidden_layers", None, "/model_info lacks"),
    ],
)
def test_each_malformed_field_is_named(field, value, message):
    doc = {**NEMO, field: value}
    if value is None:
        del doc[field]
    with pytest.raises(ModelInfoError) as error:
        ModelInfo.from_json(doc)
    assert str(error.value).startswith(message), str(error.value)


def test_our_fields_are_read_as_their_types():
    info = ModelInfo.from_json(
        {
            **NEMO,
            "model": 7,
            "engine": 8,
            "dtype": 9,
            "config_digest": 10,
            "encodings": ["nemo", 3],  # as JSON gives it: a list (a tuple is refused)
            "nccl_port": 5,
        }
    )
    assert (info.model, info.engine, info.dtype, info.config_digest) == ("7", "8", "9", "10")
    assert info.encodings == ("nemo", "3") and info.nccl_port == 5 and info.aux_layer_ids == (1, 15, 28)


def test_a_null_field_reads_as_absent():
    info = ModelInfo.from_json({**NEMO, "dtype": None, "nccl_port": None, "encodings": None, "p2p": None})
    assert info.dtype is None and info.nccl_port is None and info.encodings is None and info.p2p == {}
    assert info.to_json() == NEMO


def test_the_p2p_offer_is_written_as_a_plain_object():
    info = ModelInfo(32, 4096, 128256, (1, 15, 28), p2p=types.MappingProxyType({"backend": "gloo"}))
    doc = info.to_json()
    assert type(doc["p2p"]) is dict and doc["p2p"] == {"backend": "gloo"}
    assert doc["aux_layer_ids"] == [1, 15, 28] and type(doc["aux_layer_ids"]) is list


def test_describe_is_the_identity_on_one_line():
    info = ModelInfo(32, 4096, 128256, (1, 15, 28), dtype="bfloat16", model="/m")
    assert info.describe() == (
        "num_hidden_layers=32, hidden_size=4096, vocab_size=128256, aux_layer_ids=[1, 15, 28], dtype=bfloat16"
    )


def test_the_config_digest_ignores_names_and_places_and_nothing_else():
    config = {"hidden_size": 64, "vocab_size": 512, "rope_theta": 10000.0}
    digest = config_digest(config)
    assert digest == "635260fd77c24248"  # fixed: servers and clients of different releases compare it
    assert config_digest(dict(reversed(config.items()))) == digest  # key order does not matter
    renamed = {**config, "_name_or_path": "/elsewhere", "torch_dtype": "float16", "dtype": "bfloat16"}
    assert config_digest(renamed) == digest
    assert defining_config(renamed) == config
    # A value JSON has no type for (a path, a dtype object in some configs) is digested by its text.
    assert config_digest({**config, "path": pathlib.PurePosixPath("/a")}) == config_digest(
        {**config, "path": "/a"}
    )
    for key, value in (("hidden_size", 65), ("rope_theta", 500000.0), ("tie_word_embeddings", True)):
        assert config_digest({**config, key: value}) != digest, key


@pytest.mark.parametrize("layers, ids", [(32, [1, 15, 28]), (8, [1, 3, 4]), (9, [1, 3, 5])])
def test_eagle3_default_aux_layers(layers, ids):
    assert default_aux_layer_ids(layers) == ids


def test_aux_layer_ids_are_three_distinct_layers_of_the_model():
    assert validate_aux_layer_ids(["0", 3, 7.0], 8) == [0, 3, 7]  # both ends of the range
    for ids in ([1, 2], [1, 2, 3, 4], [1, 1, 2]):
        with pytest.raises(ValueError, match=re.escape(f"three distinct layer ids, got {ids}")):
            validate_aux_layer_ids(ids, 8)
    with pytest.raises(ValueError, match=r"aux_layer_ids \[-1, 8\] out of range for a model with 8 layers"):
        validate_aux_layer_ids([-1, 3, 8], 8)


def test_the_parallel_layout_round_trips_and_one_device_adds_nothing():
    layout = {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "nnodes": 1}
    info = ModelInfo.from_json({**NEMO, "parallel": layout})
    assert info.parallel == layout and info.to_json() == {**NEMO, "parallel": layout}
    assert ModelInfo.from_json(info.to_json()) == info
    assert "parallel" not in ModelInfo.from_json(NEMO).to_json()  # stock NeMo clients see nothing new


@pytest.mark.parametrize(
    "value, message",
    [
        ([2], "/model_info parallel is not an object"),
        ({"tensor_parallel_size": "2"}, "/model_info parallel.tensor_parallel_size is not an integer"),
        ({"nnodes": 0}, "/model_info parallel sizes {'nnodes': 0} are outside"),
    ],
)
def test_a_malformed_parallel_layout_is_named(value, message):
    with pytest.raises(ModelInfoError) as error:
        ModelInfo.from_json({**NEMO, "parallel": value})
    assert str(error.value).startswith(message), str(error.value)


@pytest.mark.parametrize(
    "field, low, high",
    [
        ("num_hidden_layers", 29, 4096),  # 29: the aux layers [1, 15, 28] must lie inside it
        ("hidden_size", 0, 1 << 17),  # 0: the model's config lacks it (NeMo's rule)
        ("vocab_size", 1, 1 << 24),
        ("nccl_port", 1, 65535),
    ],
)
def test_sizes_no_model_has_are_refused_at_both_ends(field, low, high):
    """A client sizes its buffers from these numbers: each is bounded, both bounds included."""
    for value in (low, high):
        assert getattr(ModelInfo.from_json({**NEMO, field: value}), field) == value
    lowest = 1 if field == "num_hidden_layers" else low  # below 29 layers the aux layers fall outside first
    for value in (lowest - 1, high + 1):
        with pytest.raises(ModelInfoError) as error:
            ModelInfo.from_json({**NEMO, field: value})
        assert str(error.value) == f"/model_info {field} {value} is outside [{lowest}, {high}]"


def test_aux_layer_ids_lie_inside_the_models_layers():
    assert ModelInfo.from_json({**NEMO, "aux_layer_ids": [0, 15, 31]}).aux_layer_ids == (0, 15, 31)
    for ids, bad in (([-1, 15, 28], [-1]), ([1, 15, 32], [32])):
        with pytest.raises(ModelInfoError) as error:
            ModelInfo.from_json({**NEMO, "aux_layer_ids": ids})
        assert str(error.value) == f"/model_info aux_layer_ids {bad} are outside the model's 32 layers"


def test_at_most_64_aux_layer_ids_are_read():
    assert len(ModelInfo.from_json({**NEMO, "aux_layer_ids": [1] * 64}).aux_layer_ids) == 64
    for ids in ([1] * 65, 3):
        with pytest.raises(ModelInfoError) as error:
            ModelInfo.from_json({**NEMO, "aux_layer_ids": ids})
        assert str(error.value) == (
            f"/model_info aux_layer_ids is malformed (not a list of at most 64 ids): {ids!r:.100}"
        )


@pytest.mark.parametrize("field", ["encodings", "features", "weights", "modalities"])
def test_each_list_field_is_read_as_at_most_64_names_of_at_most_64_characters(field):
    names = ["a" * 65, *(f"n{i}" for i in range(70))]
    info = ModelInfo.from_json({**NEMO, field: names})
    assert getattr(info, field) == ("a" * 64, *(f"n{i}" for i in range(63)))
    with pytest.raises(ModelInfoError) as error:
        ModelInfo.from_json({**NEMO, field: "layers"})
    assert str(error.value) == f"/model_info {field} is not a list: 'layers'"


@pytest.mark.parametrize("field", ["model", "engine", "dtype", "config_digest", "request_binding"])
def test_each_text_field_is_read_as_text_of_at_most_512_characters(field):
    assert getattr(ModelInfo.from_json({**NEMO, field: 5}), field) == "5"
    assert getattr(ModelInfo.from_json({**NEMO, field: "x" * 600}), field) == "x" * 512


def test_the_parallel_layout_is_written_as_a_plain_object_and_bounded():
    layout = types.MappingProxyType({"tensor_parallel_size": 2})
    doc = ModelInfo(32, 4096, 128256, (1, 15, 28), parallel=layout).to_json()
    assert type(doc["parallel"]) is dict and doc["parallel"] == {"tensor_parallel_size": 2}
    assert ModelInfo.from_json({**NEMO, "parallel": {"nnodes": 1 << 16}}).parallel == {"nnodes": 1 << 16}
    with pytest.raises(ModelInfoError) as error:
        ModelInfo.from_json({**NEMO, "parallel": {"nnodes": (1 << 16) + 1}})
    assert str(error.value) == "/model_info parallel sizes {'nnodes': 65537} are outside [1, 65536]"
