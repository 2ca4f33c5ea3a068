"""podTemplate.spec merged into the pod spec the operator builds: which fields the template replaces and which
it appends to."""

from __future__ import annotations

import copy
from typing import Any

SERVER_CONTAINER = "server"

# podTemplate.spec fields that replace what the flat fields and the defaults set (an empty
# topologySpreadConstraints list turns the default spread off), and those whose items are appended.
TEMPLATE_REPLACES = (
    "priorityClassName",
    "runtimeClassName",
    "schedulerName",
    "affinity",
    "topologySpreadConstraints",
)
TEMPLATE_APPENDS = ("tolerations", "volumes")
CONTAINER_APPENDS = ("env", "envFrom", "volumeMounts")


def with_template(pod_spec_: dict, template: dict) -> dict:
    """The pod spec with podTemplate.spec merged in. Ports, probes, the command and everything else the
    template's schema does not declare stay the operator's."""
    merged = copy.deepcopy(pod_spec_)
    for key in TEMPLATE_REPLACES:
        if key in template:
            merged[key] = copy.deepcopy(template[key])
    for key in TEMPLATE_APPENDS:
        if template.get(key):
            merged[key] = merged.get(key, []) + copy.deepcopy(template[key])
    server = next(c for c in merged["containers"] if c["name"] == SERVER_CONTAINER)
    for extra in template.get("containers") or ():
        if extra.get("name") != SERVER_CONTAINER:
            continue  # refused by the schema and by TargetSpec.problems()
        for key in CONTAINER_APPENDS:
            if extra.get(key):
                server[key] = server.get(key, []) + copy.deepcopy(extra[key])
        added = ((extra.get("securityContext") or {}).get("capabilities") or {}).get("add")
        if added:
            server["securityContext"]["capabilities"]["add"] = list(added)
    return merged


def _objects(value: Any, where: str) -> list:
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise TypeError(f"{where} must be a list of objects")
    return value


def parse(raw: Any) -> dict:
    """podTemplate as given, once its shape is what the builders merge (the schema says the same; a spec that
    skipped validation gets an InvalidSpec instead of a failed reconcile)."""
    template = dict(raw)
    for part in ("metadata", "spec"):
        if not isinstance(template.get(part, {}), dict):
            raise TypeError(f"podTemplate.{part} must be an object")
    for key in ("labels", "annotations"):
        if not isinstance((template.get("metadata") or {}).get(key, {}), dict):
            raise TypeError(f"podTemplate.metadata.{key} must be an object")
    spec = template.get("spec") or {}
    for key in ("tolerations", "topologySpreadConstraints", "volumes", "containers"):
        _objects(spec.get(key) or [], f"podTemplate.spec.{key}")
    for container in spec.get("containers") or ():
        for key in ("env", "envFrom", "volumeMounts"):
            _objects(container.get(key) or [], f"podTemplate.spec.containers[].{key}")
        added = ((container.get("securityContext") or {}).get("capabilities") or {}).get("add") or []
        if not isinstance(added, list):
            raise TypeError("podTemplate.spec.containers[].securityContext.capabilities.add must be a list")
    return template
