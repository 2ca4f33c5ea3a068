"""podTemplate.spec merged into the pod spec the operator builds: which fields the template replaces and which
it appends to."""

from __future__ import annotations

import copy

from .spec_checks import SERVER_CONTAINER

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
