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
    ("fields", "error"),
    [
        (dict(layers=(1, 1)), "duplicate_layer"),
        (dict(layers=(-2,)), "layer_out_of_range"),
        (dict(layers=(True,)), "bad_features"),
        (dict(), "bad_features"),  # asks for nothing
        (dict(layers=(1,), logits="draft_probs"), "bad_features"),  # draft_probs are shifted
        (dict(layers=(1,), shift=True), "bad_features"),  # nothing that true shifts
        (dict(layers=(1,), shift=("logits",)), "bad_features"),  # not asked for
        (dict(layers=(1,), shift=("hidden_states", "hidden_states")), "bad_features"),
        (dict(layers=(1,), shift="hidden_states"), "bad_features"),
        (dict(layers=(1,), logits="draft_probs", shift=("hidden_states",)), "bad_features"),
        (dict(final_hidden=1), "bad_features"),
        (dict(logits="softmax"), "bad_features"),
        (dict(layers=tuple(range(300))), "bad_features"),
    ],
)
def test_a_malformed_request_names_what_is_wrong(fields, error):
    with pytest.raises(FeatureError) as err:
        Features(**fields)
    assert err.value.error == error and err.value.detail


def test_check_against_a_server_names_the_layers_and_capabilities_it_lacks():
    features = Features(layers=(3, 8, -1), final_hidden=True)
    with pytest.raises(FeatureError, match=r"layers \[8\] are out of range.*0\.\.7"):
        features.check(8, ("layers", "embedding_output", "final_hidden"))
    with pytest.raises(FeatureError, match="cannot capture embedding_output, final_hidden"):
        features.check(9, ("layers",))
    with pytest.raises(FeatureError, match="offers no feature requests"):
        features.check(9, None)  # a stock NeMo server
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
    with pytest.raises(KeyError, match="unknown draft family 'medusa'"):
        family("medusa")


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
