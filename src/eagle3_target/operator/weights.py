"""`spec.weights`: the checkpoint every replica serves, refreshed in place (`POST /weights/refresh`) rather than by
replacing pods; the admin token Secret that lets the operator ask; and which replicas to refresh next. Pure."""

from __future__ import annotations

import base64
import re
import secrets
from dataclasses import dataclass
from typing import Any

from . import GROUP

# What the server accepts as a version label (protocol/model_info.check_target_version), and the CRD's CEL rule.
VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+/-]{0,127}")
SOURCE_SCHEMES = ("/", "s3://")  # a checkpoint folder the pod can read, or object storage
VERSION_ANNOTATION = f"{GROUP}/target-version"  # the version the operator last saw a pod answer with
# the container's restart count at that answer: a restarted server serves its start-up weights again
RESTARTS_ANNOTATION = f"{GROUP}/target-version-restarts"
READINESS_GATE = f"{GROUP}/weights-ready"  # a new pod joins the endpoints only once it serves spec.weights
ADMIN_KEY = "token"
ADMIN_DIR = "/var/run/eagle3-target-admin"


@dataclass(frozen=True)
class Weights:
    source: str
    version: str

    @classmethod
    def parse(cls, raw: dict[str, Any] | None) -> Weights | None:
        return cls(source=str(raw["source"]), version=str(raw["version"])) if raw else None

    def problems(self) -> list[str]:
        """The CRD's rules, for a spec that skipped validation."""
        errors = []
        if not self.source.startswith(SOURCE_SCHEMES):
            errors.append(f"weights.source {self.source!r:.80} is neither an absolute path nor an s3:// URI")
        if not VERSION.fullmatch(self.version):
            errors.append(
                f"weights.version {self.version!r:.80} is not 1 to 128 letters, digits and ._:+/- starting "
                "with a letter or digit"
            )
        return errors

    def body(self) -> dict[str, str]:
        return {"source": self.source, "version": self.version}


def admin_secret_name(name: str) -> str:
    return f"{name}-admin"


def admin_secret(name: str, namespace: str, labels: dict) -> dict:
    """A fresh random token, mounted only in the target's own pods (`serve --admin-token-file`); trainers get
    the other Secret (authTokenSecret), which cannot refresh."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": admin_secret_name(name), "namespace": namespace, "labels": labels},
        "type": "Opaque",
        "data": {ADMIN_KEY: base64.b64encode(secrets.token_urlsafe(32).encode()).decode()},
    }


def served_version(annotations: dict, restarts: int) -> str:
    """The version a pod serves as far as the operator knows: "" once its server restarted since."""
    if annotations.get(RESTARTS_ANNOTATION) != str(restarts):
        return ""
    return annotations.get(VERSION_ANNOTATION, "")


def to_refresh(pods, version: str, replicas: int, budget: int, busy: set[str], resting: set[str]) -> list:
    """The pods to refresh now: up (serving, gated or not), in range, not at `version`, not refreshing already
    (`busy`) nor waiting out a failure (`resting`); at most `budget` refreshing at once, counting `busy`.
    Pods not yet endpoints go first: they cost no availability."""
    wanted = [
        p
        for p in pods
        if not p.terminating
        and 0 <= p.ordinal < replicas
        and p.rank == 0
        and p.serving
        and p.ip
        and p.http_port
        and p.target_version != version
        and p.name not in busy | resting
    ]
    wanted.sort(key=lambda p: (p.ready, p.ordinal))
    return wanted[: max(budget - len(busy), 0)]
