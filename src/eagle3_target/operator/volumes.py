"""The volumes of a target pod and where the server container mounts them."""

from __future__ import annotations

import copy

from .target_spec import TargetSpec
from .weights import ADMIN_DIR, ADMIN_KEY, admin_secret_name

TOKEN_DIR = "/var/run/eagle3-target"
CACHE_DIR = "/var/cache/eagle3-target"


def pod_volumes(spec: TargetSpec, name: str) -> tuple[list[dict], list[dict]]:
    """Scratch space for a read-only root filesystem, the Hugging Face cache (a shared PVC, else a bounded
    emptyDir), shared memory for NCCL, the operator's admin token, and the optional model and token."""
    if spec.model_cache_claim:
        cache = {"persistentVolumeClaim": {"claimName": spec.model_cache_claim}}
    else:
        cache = {"emptyDir": {"sizeLimit": spec.model_cache_size_limit}}
    shm = {"medium": "Memory", **({"sizeLimit": spec.shm_size} if spec.shm_size else {})}
    admin = {"secretName": admin_secret_name(name), "items": [{"key": ADMIN_KEY, "path": ADMIN_KEY}]}
    volumes = [
        {"name": "tmp", "emptyDir": {}},
        {"name": "cache", **cache},
        {"name": "dshm", "emptyDir": shm},
        {"name": "admin-token", "secret": admin},
    ]
    mounts = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "cache", "mountPath": CACHE_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "admin-token", "mountPath": ADMIN_DIR, "readOnly": True},
    ]
    if spec.model_volume:
        mv = spec.model_volume
        if mv.get("persistentVolumeClaim"):
            source = {
                "persistentVolumeClaim": {**mv["persistentVolumeClaim"], "readOnly": mv.get("readOnly", True)}
            }
        else:
            source = copy.deepcopy(mv["volumeSource"])
        volumes.append({"name": "model", **source})
        mount = {
            "name": "model",
            "mountPath": mv.get("mountPath", "/models"),
            "readOnly": mv.get("readOnly", True),
        }
        if mv.get("subPath"):
            mount["subPath"] = mv["subPath"]
        mounts.append(mount)
    if spec.auth_secret_name:
        items = [{"key": spec.auth_secret_key, "path": "token"}]
        volumes.append(
            {"name": "auth-token", "secret": {"secretName": spec.auth_secret_name, "items": items}}
        )
        mounts.append({"name": "auth-token", "mountPath": TOKEN_DIR, "readOnly": True})
    return volumes, mounts
