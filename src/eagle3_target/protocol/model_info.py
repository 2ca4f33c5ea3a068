"""/model_info: the target a server runs, written by the server and read by every client.

NeMo's four keys come first; our extensions follow and a stock NeMo server
omits them (they read as None here). Identity is what must match across a
fleet for a trainer to mix its servers' batches; names (model path, engine) and
per-server facts (ports, the p2p offer) may differ.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

NEMO_KEYS = ("num_hidden_layers", "hidden_size", "vocab_size", "aux_layer_ids")
IDENTITY_KEYS = (*NEMO_KEYS, "dtype", "config_digest")


# Config keys that name or place a model rather than define it: two copies of one model digest alike.
# transformers_version is the library that wrote the config: a fleet's and a trainer's differ (NeMo 0.7.0 pins
# transformers 5.18.0) while the model is one.
UNDIGESTED_CONFIG_KEYS = ("_name_or_path", "torch_dtype", "dtype", "transformers_version")


def defining_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A Hugging Face config dict (``to_diff_dict()``) without the keys that do not define the model, in its
    sub-configs too (a vision-language model loaded in float32 has ``text_config.dtype`` set; its config.json
    read by a trainer does not)."""
    return {
        k: defining_config(v) if isinstance(v, Mapping) else v
        for k, v in config.items()
        if k not in UNDIGESTED_CONFIG_KEYS
    }


def config_digest(config: Mapping[str, Any]) -> str:
    """The short digest /model_info reports, the same on server and client for one config."""
    blob = json.dumps(defining_config(config), sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


class ModelInfoError(ValueError):
    """A /model_info document that is not one."""


# A target version: a start-up digest ("sha256-" and 16 hex digits) or the label a refresh gave. It travels in
# a header and a Prometheus label, so it is short printable ASCII without spaces.
TARGET_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+/-]{0,127}")


def check_target_version(label: object) -> str:
    """``label`` if it can name a target version; ValueError saying what one looks like otherwise."""
    if not isinstance(label, str) or not TARGET_VERSION.fullmatch(label):
        raise ValueError(
            f"a target version is 1 to 128 characters of letters, digits and ._:+/- starting with a letter or "
            f"digit, not {label!r:.80}"
        )
    return label


NEWEST = "newest"  # the target version a session trains on unless it names one (client/versions.py)


def check_version_choice(choice: object) -> str:
    """``newest`` or a target version label; ValueError in one line otherwise."""
    if choice == NEWEST:
        return NEWEST
    try:
        return check_target_version(choice)
    except ValueError as exc:
        raise ValueError(f"target_version is {NEWEST!r} or {exc}") from None


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's default low/mid/high recipe: [1, L//2 - 1, L - 4]."""
    return [1, num_layers // 2 - 1, num_layers - 4]


def validate_aux_layer_ids(ids: list[int], num_layers: int) -> list[int]:
    ids = [int(i) for i in ids]
    if len(ids) != 3 or len(set(ids)) != 3:
        raise ValueError(f"aux_layer_ids must be three distinct layer ids, got {ids}")
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"aux_layer_ids {bad} out of range for a model with {num_layers} layers")
    return ids


@dataclass(frozen=True)
class ModelInfo:
    num_hidden_layers: int
    hidden_size: int  # 0 where the model's config lacks it (NeMo's rule)
    vocab_size: int
    aux_layer_ids: tuple[int, ...]
    model: str | None = None
    engine: str | None = None
    dtype: str | None = None  # "bfloat16", "float32", ...: torch's name without "torch."
    config_digest: str | None = None
    encodings: tuple[str, ...] | None = None  # None: a server from before encodings (sends "nemo")
    features: tuple[str, ...] | None = None  # what /generate can capture (features.py CAN_*); None: nothing
    weights: tuple[str, ...] | None = None  # what /weights/<name> hands out (features.py WEIGHT_NAMES)
    # what the target takes besides text ("image"); None: text only, as every stock server
    modalities: tuple[str, ...] | None = None
    nccl_port: int | None = None  # NeMo's p2p rendezvous port, where the server fixes one
    p2p: Mapping[str, Any] = field(default_factory=dict)  # the server's p2p offer: {"backend": ..., ...}
    request_binding: str | None = None  # "sha256": /generate replies echo our request id (binding.py)
    # How the replica is split (PARALLEL_KEYS); {} for one device, so a stock NeMo client sees nothing new
    parallel: Mapping[str, int] = field(default_factory=dict)
    # The weights served now: their digest at start-up, the label of the latest refresh after one
    target_version: str | None = None
    # When the latest refresh began serving (Unix seconds, the server's clock); None: the start-up weights.
    # It orders versions: a client asking for the newest takes the latest refresh (client/versions.py).
    refreshed_at: float | None = None

    @classmethod
    def from_json(cls, doc: Any) -> ModelInfo:
        """Parse a /model_info body (already JSON-decoded); ModelInfoError names what is wrong, including
        sizes no model has (``LIMITS``) and aux layer ids outside the model's layers."""
        if not isinstance(doc, Mapping):
            raise ModelInfoError(f"/model_info is not a JSON object: {doc!r:.200}")
        missing = [k for k in NEMO_KEYS if doc.get(k) is None]
        if missing:
            raise ModelInfoError(f"/model_info lacks {', '.join(missing)}")
        try:
            known = {f.name for f in fields(cls)}
            values = {k: v for k, v in doc.items() if k in known and v is not None}
            for name in NEMO_KEYS[:3]:
                values[name] = _int(values[name], name)
            if not isinstance(values["aux_layer_ids"], list) or len(values["aux_layer_ids"]) > MAX_AUX_LAYERS:
                raise ModelInfoError(
                    f"/model_info aux_layer_ids is malformed (not a list of at most 64 ids): {values['aux_layer_ids']!r:.100}"
                )
            values["aux_layer_ids"] = tuple(_int(i, "aux_layer_ids") for i in values["aux_layer_ids"])
            if "nccl_port" in values:
                values["nccl_port"] = _int(values["nccl_port"], "nccl_port")
            for name in ("encodings", "features", "weights", "modalities"):
                if name in values:
                    if not isinstance(values[name], list):
                        raise ModelInfoError(f"/model_info {name} is not a list: {values[name]!r:.100}")
                    values[name] = tuple(str(e)[:64] for e in values[name][:64])
            if "parallel" in values:
                values["parallel"] = _parallel(values["parallel"])
            if not isinstance(values.get("p2p", {}), Mapping):
                raise ModelInfoError(f"/model_info p2p is not an object: {values['p2p']!r:.100}")
            for name in ("model", "engine", "dtype", "config_digest", "request_binding"):
                if name in values:
                    values[name] = str(values[name])[:MAX_TEXT]
            if "target_version" in values:
                values["target_version"] = check_target_version(values["target_version"])
            if "refreshed_at" in values:
                values["refreshed_at"] = _seconds(values["refreshed_at"], "refreshed_at")
        except ModelInfoError:
            raise
        except (TypeError, ValueError) as exc:  # ValueError: a target_version no version looks like
            raise ModelInfoError(f"/model_info has a malformed field: {exc}") from None
        _check_ranges(values)
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """NeMo's four keys first, then ours; keys a server does not know are left out."""
        doc: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in NEMO_KEYS or value not in (None, {}, ()):
                doc[f.name] = list(value) if isinstance(value, tuple) else value
        for name in ("p2p", "parallel"):
            if name in doc:
                doc[name] = dict(doc[name])
        return doc

    def identity(self) -> dict[str, Any]:
        """The identity keys this server reports (a stock NeMo server reports only NeMo's four)."""
        return {k: getattr(self, k) for k in IDENTITY_KEYS if getattr(self, k) is not None}

    def difference(self, other: ModelInfo) -> list[str]:
        """One line per identity key both report with different values: empty when interchangeable."""
        ours, theirs = self.identity(), other.identity()
        return [
            f"{k}: {_show(theirs[k])} (expected {_show(ours[k])})"
            for k in IDENTITY_KEYS
            if k in ours and k in theirs and ours[k] != theirs[k]
        ]

    def describe(self) -> str:
        """The identity as one line, e.g. for grouping servers that disagree."""
        return ", ".join(f"{k}={_show(v)}" for k, v in self.identity().items())


# What a /model_info may say: beyond these no model exists, and a client would size buffers from them.
LIMITS = {
    "num_hidden_layers": (1, 4096),
    "hidden_size": (0, 1 << 17),  # 0: the model's config lacks it (NeMo's rule)
    "vocab_size": (1, 1 << 24),
    "nccl_port": (1, 65535),
}
MAX_AUX_LAYERS = 64
PARALLEL_KEYS = ("tensor_parallel_size", "pipeline_parallel_size", "nnodes")
MAX_PARALLEL = 1 << 16
MAX_TEXT = 512


def _check_ranges(values: Mapping[str, Any]) -> None:
    for name, (low, high) in LIMITS.items():
        if name in values and not low <= values[name] <= high:
            raise ModelInfoError(f"/model_info {name} {values[name]} is outside [{low}, {high}]")
    layers = values["num_hidden_layers"]
    bad = [i for i in values["aux_layer_ids"] if not 0 <= i < layers]
    if bad:
        raise ModelInfoError(f"/model_info aux_layer_ids {bad} are outside the model's {layers} layers")


def _seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e11:
        raise ModelInfoError(f"/model_info {name} is not a time in Unix seconds: {value!r:.100}")
    return float(value)


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelInfoError(f"/model_info {name} is not an integer: {value!r:.100}")
    return value


def _parallel(value: Any) -> dict[str, int]:
    if not isinstance(value, Mapping):
        raise ModelInfoError(f"/model_info parallel is not an object: {value!r:.100}")
    sizes = {k: _int(value[k], f"parallel.{k}") for k in PARALLEL_KEYS if k in value}
    bad = {k: v for k, v in sizes.items() if not 1 <= v <= MAX_PARALLEL}
    if bad:
        raise ModelInfoError(f"/model_info parallel sizes {bad} are outside [1, {MAX_PARALLEL}]")
    return sizes


def _show(value: Any) -> str:
    return str(list(value)) if isinstance(value, tuple) else str(value)
