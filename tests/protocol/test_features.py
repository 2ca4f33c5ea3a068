"""protocol/features.py and protocol/families: the request's header, its checks, each family's request."""

import sys
from pathlib import Path

import pytest

import eagle3_target.protocol.families as package
from eagle3_target.protocol.families import families, family
from eagle3_target.protocol.features import FeatureError, Features
from eagle3_target.protocol.model_info import ModelInfo


def test_the_header_round_trips_and_reads_the_same_for_the_same_request():
    features = Features(layers=[5, -1, 2], final_hidden=True, logits="full", shift=True)
    assert features.layers == (5, -1, 2)
    text = features.to_header()
    assert text == '{"layers":[5,-1,2],"final_hidden":true,"logits":"full","shift":true}'
    assert Features.from_header(text) == features
    assert features.reply_keys == ("hidden_states", "final_hidden", "logits")
    assert features.needs() == ("layers", "embedding_output", "final_hidden", "logits")


def test_shift_names_any_capture_and_true_reads_as_before():
    features = Features(layers=(1,), final_hidden=True, logits="full", shift=["logits", "hidden_states"])
    assert features.shift == ("hidden_states", "logits")  # in reply order, whatever order it was given in
    text = features.to_header()
    assert text == '{"layers":[1],"final_hidden":true,"logits":"full","shift":["hidden_states","logits"]}'
    assert Features.from_header(text) == features
    legacy = Features(layers=(1,), logits="full", image_mask=True, shift=True)
    assert legacy.shift == ("logits", "image_mask") and '"shift":true' in legacy.to_header()
    assert (
        Features(layers=(1,), logits="full", image_mask=True, shift=("logits",)).to_header().count("[") == 2
    )
    assert Features(layers=(1,)).shift == () and '"shift":false' in Features(layers=(1,)).to_header()
    with pytest.raises(FeatureError, match="shift is true, false or a list"):
        Features.from_header('{"layers":[1],"shift":{"a":1}}')


@pytest.mark.parametrize(
    ("fields", "error", "detail"),
    [
        (dict(layers=(1, 1)), "duplicate_layer", "layers [1] are asked for more than once"),
        (dict(layers=(-2,)), "layer_out_of_range", "layer ids are -1 (the embeddings) or above, got [-2]"),
        (dict(layers=(True,)), "bad_features", "layers must be integers, got [True]"),
        (dict(), "bad_features", "the request asks for nothing: name layers, final_hidden or logits"),
        (
            dict(layers=(1,), logits="draft_probs"),
            "bad_features",
            "draft_probs are EAGLE-3's shifted supervision: shift the logits",
        ),
        (
            dict(layers=(1,), shift=True),
            "bad_features",
            "shift=true shifts the logits and the image mask: ask for one",
        ),
        (
            dict(layers=(1,), final_hidden=True, shift=("logits",)),
            "bad_features",
            "shift names captures asked for (hidden_states, final_hidden) once each: ('logits',)",
        ),
        (
            dict(layers=(1,), shift=("hidden_states", "hidden_states")),
            "bad_features",
            "shift names captures asked for (hidden_states) once each: ('hidden_states', 'hidden_states')",
        ),
        (
            dict(layers=(1,), shift="hidden_states"),
            "bad_features",
            "shift is true, false or a list of hidden_states, final_hidden, logits, image_mask",
        ),
        (
            dict(layers=(1,), logits="draft_probs", shift=("hidden_states",)),
            "bad_features",
            "draft_probs are EAGLE-3's shifted supervision: shift the logits",
        ),
        (dict(final_hidden=1), "bad_features", "final_hidden and image_mask are true or false"),
        (
            dict(layers=(1,), image_mask="yes"),
            "bad_features",
            "final_hidden and image_mask are true or false",
        ),
        (dict(logits="softmax"), "bad_features", "logits is one of none, full, draft_probs, got 'softmax'"),
        (dict(layers=tuple(range(-1, 256))), "bad_features", "at most 256 layers, got 257"),
    ],
)
def test_a_malformed_request_names_what_is_wrong(fields, error, detail):
    """The server answers with these words (a 4xx's "detail"), so they are checked whole."""
    with pytest.raises(FeatureError) as err:
        Features(**fields)
    assert (err.value.error, err.value.detail, str(err.value)) == (error, detail, detail)


def test_any_one_capture_is_a_request_and_256_layers_are_allowed():
    assert Features(logits="full").captures == ("logits",)
    assert Features(image_mask=True).reply_keys == ("image_mask",)
    assert len(Features(layers=tuple(range(-1, 255))).layers) == 256


def test_a_header_up_to_its_limit_is_read_and_one_past_it_is_refused():
    text = '{"layers":[1],"image_mask":true}'
    padded = text[:-1] + " " * (4096 - len(text)) + "}"  # JSON whitespace up to exactly 4096 characters
    assert len(padded) == 4096
    assert Features.from_header(padded) == Features(layers=(1,), image_mask=True)
    with pytest.raises(FeatureError) as err:
        Features.from_header(padded[:-1] + " }")
    assert (err.value.error, err.value.detail) == (
        "bad_features",
        "the features header is over 4096 characters",
    )


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ("[1]", "the features header is a JSON object"),
        ('{"layers":5}', "layers is a list of integers"),
        ('{"layers":[1],"colour":"red","Shift":true}', "unknown feature fields ['Shift', 'colour']"),
        (
            '{"layers":[1',
            "the features header is not JSON: Expecting ',' delimiter: line 1 column 13 (char 12)",
        ),
    ],
)
def test_a_header_that_is_not_a_request_names_what_is_wrong(text, detail):
    with pytest.raises(FeatureError) as err:
        Features.from_header(text)
    assert (err.value.error, err.value.detail) == ("bad_features", detail)


def test_needs_names_the_capabilities_each_capture_takes():
    assert Features(layers=(0,)).needs() == ("layers",)  # layer 0 is a decoder layer's output
    assert Features(layers=(-1,)).needs() == ("embedding_output",)
    features = Features(layers=(2,), logits="draft_probs", shift=True, image_mask=True)
    assert features.needs() == ("layers", "draft_probs", "image_mask")
    assert features.reply_keys == (
        "hidden_states",
        "target_probs",
        "position_mask",
        "input_ids",
        "loss_mask",
        "image_mask",
    )


def test_check_against_a_server_names_the_layers_and_capabilities_it_lacks():
    features = Features(layers=(3, 8, -1), final_hidden=True)
    with pytest.raises(FeatureError) as err:
        features.check(8, ("layers", "embedding_output", "final_hidden"))
    assert (err.value.error, err.value.detail) == (
        "layer_out_of_range",
        "layers [8] are out of range: the server's target has layers 0..7 (and -1, the embeddings)",
    )
    with pytest.raises(FeatureError) as err:
        features.check(9, ("layers", "logits"))
    assert (err.value.error, err.value.detail) == (
        "feature_not_offered",
        "the server cannot capture embedding_output, final_hidden (it offers layers, logits)",
    )
    with pytest.raises(FeatureError, match=r"^http://a cannot capture .* \(it offers no feature requests\)$"):
        features.check(9, None, "http://a")  # a stock NeMo server
    features.check(9, ("layers", "embedding_output", "final_hidden"))


def test_model_info_carries_features_and_weights_and_omits_them_when_empty():
    info = ModelInfo(8, 64, 512, (1, 3, 4), features=("layers",), weights=("lm_head",))
    doc = info.to_json()
    assert doc["features"] == ["layers"] and doc["weights"] == ["lm_head"]
    assert ModelInfo.from_json(doc) == info
    assert "features" not in ModelInfo(8, 64, 512, (1, 3, 4), features=()).to_json()
    assert ModelInfo.from_json(ModelInfo(8, 64, 512, (1, 3, 4)).to_json()).features is None


def test_every_family_is_found_and_asks_a_valid_request():
    modules = Path(package.__file__).parent.glob("*.py")
    assert set(families()) == {p.stem for p in modules} - {"__init__"}
    for name, entry in families().items():
        for ask in filter(None, (entry.ask, entry.compact)):
            assert isinstance(ask([1, 9, 17, 25, 35], 36), Features), name
    assert family("dspark").ask([-1, 9, 35], 36) == Features(layers=(-1, 9), final_hidden=True)
    assert family("eagle3").ask([1, 17, 32], 36).logits == "draft_probs"
    with pytest.raises(KeyError) as refused:
        family("medusa")
    known = ", ".join(sorted(families()))  # the refusal names every family a server knows
    assert refused.value.args == (f"unknown draft family 'medusa'; known: {known}",)


def test_a_new_family_is_one_module(tmp_path, monkeypatch):
    """Dropping a module with a FAMILY into protocol/families is all it takes for a server to know it."""
    (tmp_path / "medusa.py").write_text(
        "from eagle3_target.protocol.families import Family\n"
        "from eagle3_target.protocol.features import Features\n"
        "FAMILY = Family('medusa', lambda _l, _n: Features(final_hidden=True), ())\n"
    )
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    package.families.cache_clear()
    try:
        assert family("medusa").ask([], 32) == Features(final_hidden=True)
    finally:
        monkeypatch.undo()
        package.families.cache_clear()
        sys.modules.pop("eagle3_target.protocol.families.medusa", None)
