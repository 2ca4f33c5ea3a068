"""At setup, the recipe's own target (``recipe_args.target_model_name_or_path``) against the target the fleet
serves: a draft trained on another model's features is wrong and nothing else would say so.

The fleet admits only servers whose /model_info matches its first one (client/identity.py), so checking that
reference checks every server. Compared: the text model's layers, hidden size and vocabulary, and the config
digest where the fleet reports one (protocol/model_info.py's, computed here the same way from the recipe's
config where transformers' own config class reads it, as the server's does). ``remote_target.allow_target_mismatch: true`` trains against a differing fleet on purpose, with a
warning.
"""

from __future__ import annotations

import logging
from typing import Any

from eagle3_target.protocol.model_info import config_digest

from .fleet_target import FleetMismatchError

log = logging.getLogger(__name__)
SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "vocab_size")


def recipe_target(recipe_args: Any) -> tuple[str, dict[str, Any]] | None:
    """The recipe's target path and its Hugging Face config as a dict, or None where it names none."""
    path = recipe_args.get("target_model_name_or_path", None) if recipe_args is not None else None
    if not path:
        return None
    from transformers import AutoConfig

    trust = bool(recipe_args.get("trust_remote_code", False))
    config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust)
    text = config.get_text_config()
    shape = {key: getattr(text, key, None) for key in SHAPE_KEYS}
    # A config class a recipe registers (NeMo's MiniMax M3 VL) fills other defaults than the transformers class
    # a server reads the same config.json with, so only transformers' own classes' digests compare.
    own = type(config).__module__.startswith("transformers.")
    return str(path), {**shape, "config_digest": config_digest(config.to_diff_dict()) if own else None}


def target_difference(expected: dict[str, Any], info: dict[str, Any]) -> list[str]:
    """What differs, in words (``key here, value on the fleet``): the shape, then the config digest where
    the fleet reports one."""
    wrong = [
        f"{key} {expected[key]} here, {info.get(key)} on the fleet"
        for key in SHAPE_KEYS
        if expected.get(key) is not None and expected[key] != info.get(key)
    ]
    digests = expected["config_digest"] and info.get("config_digest")
    if digests and info["config_digest"] != expected["config_digest"] and not wrong:
        wrong.append("same layers, hidden size and vocabulary, another config")
    return wrong


def check_target(recipe_args: Any, info: dict[str, Any], allow_mismatch: bool) -> None:
    """Refuse (FleetMismatchError, one line) a fleet that serves another target than the recipe's."""
    found = recipe_target(recipe_args)
    if found is None:
        return
    path, expected = found
    wrong = target_difference(expected, info)
    if not wrong:
        return
    line = (
        f"the fleet serves another target than recipe_args.target_model_name_or_path={path} "
        f"(config digest {expected['config_digest'] or 'not compared'} here, {info.get('config_digest') or 'not reported'} "
        f"on the fleet; {', '.join(wrong)})"
    )
    if allow_mismatch:
        log.warning("%s; training anyway (remote_target.allow_target_mismatch)", line)
        return
    raise FleetMismatchError(
        f"{line}: serve that target, point recipe_args.target_model_name_or_path at the fleet's, "
        "or set remote_target.allow_target_mismatch: true to train against it on purpose"
    )
