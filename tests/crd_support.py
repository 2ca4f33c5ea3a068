"""What a real API server does to a custom resource before it stores it: structural pruning (fields the CRD's
schema does not declare are dropped) and defaulting (absent fields with a schema default are filled). Used by
the kmock harness, so the operator sees what a cluster would give it, and by the schema tests."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

CRD_PATH = Path(__file__).resolve().parents[1] / "manifests" / "crd.yaml"
# Kept at the root of every object whatever the schema says (metadata has its own, non-structural handling).
ROOT_FIELDS = ("apiVersion", "kind", "metadata")


def crd_schema(path: Path = CRD_PATH) -> dict:
    crd = yaml.safe_load(path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage", True)]
    return version["schema"]["openAPIV3Schema"]


def prune(schema: dict, value):
    """`value` without the fields `schema` does not declare, recursively (x-kubernetes-preserve-unknown-fields
    keeps a subtree's unknown fields; declared fields below it are still pruned)."""
    if isinstance(value, dict) and schema.get("type", "object") == "object":
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields", False)
        pruned = {}
        for key, item in value.items():
            if key in properties:
                pruned[key] = prune(properties[key], item)
            elif isinstance(extra, dict):
                pruned[key] = prune(extra, item)
            elif keep_unknown or extra is True:
                pruned[key] = copy.deepcopy(item)
        return pruned
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(schema["items"], item) for item in value]
    return copy.deepcopy(value)


def default(schema: dict, value):
    """`value` with absent fields that have a schema default filled in, recursively (defaults are themselves
    defaulted, as the API server does)."""
    if isinstance(value, dict):
        filled = dict(value)
        for key, sub in (schema.get("properties") or {}).items():
            if key not in filled and "default" in sub:
                filled[key] = copy.deepcopy(sub["default"])
            if key in filled:
                filled[key] = default(sub, filled[key])
        if isinstance(schema.get("additionalProperties"), dict):
            for key in set(filled) - set(schema.get("properties") or {}):
                filled[key] = default(schema["additionalProperties"], filled[key])
        return filled
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [default(schema["items"], item) for item in value]
    return value


def admit(schema: dict, obj: dict) -> dict:
    """What the API server stores for `obj`: pruned, then defaulted; apiVersion, kind and metadata as given."""
    body = {k: v for k, v in obj.items() if k not in ROOT_FIELDS}
    stored = default(schema, prune(schema, body))
    return {**{k: copy.deepcopy(obj[k]) for k in ROOT_FIELDS if k in obj}, **stored}
