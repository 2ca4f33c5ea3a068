"""A NeMo EAGLE-3 draft checkpoint as vLLM's own EAGLE-3 draft loads it, written to a folder of the server's own.

NeMo saves the draft's weights under its module's ``model.`` wrapper, and its config is the target's config plus
the draft's fields, `num_hidden_layers` included; vLLM's ``LlamaForCausalLMEagle3`` prefixes ``model.`` itself
and builds as many decoder layers as `num_hidden_layers` says, loading only those the weights hold and leaving
the rest as they were made, without a word. So the export strips the prefix, sets `num_hidden_layers` to the
layers the weights hold (as NeMo's own draft class builds them), names the architecture vLLM registers, and
names the server's aux layers in vLLM's numbering (its layer i is the input of decoder layer i, so ours + 1).
Everything vLLM would take silently is checked here first: a draft that is not this target's is refused.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import InvalidInput, OutOfRange
from ..runners import RunnerInfo
from .drafts import check_architecture, check_fits, weight_files

VLLM_ARCHITECTURE = "LlamaForCausalLMEagle3"
NEMO_PREFIX = "model."
_LAYER = re.compile(r"layers\.(\d+)\.")


def export(folder: Path, info: RunnerInfo, out: Path) -> Path:
    """Write ``folder``'s draft for the target ``info`` describes into ``out`` (config.json, model.safetensors)."""
    from safetensors.torch import load_file, save_file

    config = _config(folder)
    _check_fits(config, info)
    try:
        tensors = {k: v for f in weight_files(folder) for k, v in load_file(f).items()}
    except (OSError, ValueError, RuntimeError) as exc:
        raise InvalidInput(
            "draft_weights_mismatch", f"the draft's weights are unreadable: {exc}"[:300]
        ) from None
    tensors = {k.removeprefix(NEMO_PREFIX): v for k, v in tensors.items()}
    config["num_hidden_layers"] = _check_weights(tensors, config, info)
    config["architectures"] = [VLLM_ARCHITECTURE]
    config["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in info.aux_layer_ids]
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def _config(folder: Path) -> dict:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise InvalidInput(
            "invalid_draft_config", f"the draft's config.json is unreadable: {exc}"[:300]
        ) from None
    if not isinstance(config, dict):
        raise InvalidInput("invalid_draft_config", "the draft's config.json is not a JSON object")
    check_architecture(config.get("architectures"), bool(config.get("parallel_drafting")))
    for name in ("hidden_size", "vocab_size"):
        if type(config.get(name)) is not int or config[name] < 1:
            raise InvalidInput("invalid_draft_config", f"the draft's config.json has no positive {name!r}")
    return config


def _check_fits(config: dict, info: RunnerInfo) -> None:
    check_fits(config["vocab_size"], config.get("target_hidden_size", config["hidden_size"]), info)
    ids = list(info.aux_layer_ids)
    if ids != sorted(set(ids)):  # vLLM concatenates its aux states in layer order
        raise OutOfRange(
            "draft_mismatch",
            f"vLLM's EAGLE-3 reads its aux layers in increasing order; this server has {ids}",
        )


def _check_weights(tensors: dict, config: dict, info: RunnerInfo) -> int:
    """The number of decoder layers the weights hold, once the tensors vLLM reads by shape are as it wants."""
    hidden, vocab = config["hidden_size"], config.get("draft_vocab_size") or config["vocab_size"]
    wants = {"fc.weight": (hidden, 3 * info.hidden_size), "lm_head.weight": (vocab, hidden)}
    if vocab != config["vocab_size"]:
        wants["d2t"] = (vocab,)
    for name, shape in wants.items():
        got = tensors.get(name)
        if got is None or tuple(got.shape) != shape:
            seen = None if got is None else tuple(got.shape)
            raise InvalidInput("draft_weights_mismatch", f"the draft's {name} is {seen}, not {shape}")
    layers = {int(m.group(1)) for k in tensors if (m := _LAYER.match(k))}
    if not layers or layers != set(range(len(layers))):
        raise InvalidInput(
            "draft_weights_mismatch", f"the draft's decoder layers are {sorted(layers)}, not 0, 1, ..."
        )
    return len(layers)
