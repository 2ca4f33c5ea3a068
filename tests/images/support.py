"""The project's images: their names and version (pyproject.toml's, the one place it lives), and the
Dockerfiles the repository holds."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tools import REPO

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
REGISTRY = "ghcr.io/eagle3-target"
SERVER = f"{REGISTRY}/eagle3-target"
OPERATOR = f"{REGISTRY}/eagle3-target-operator"
SGLANG = f"{REGISTRY}/eagle3-target-sglang"
TRAINER = f"{REGISTRY}/eagle3-target-trainer"
BUILD_SCRIPT = REPO / "scripts" / "build-images.sh"


def dockerfiles() -> list[Path]:
    """Every Dockerfile or Containerfile in the repository (mirrors and virtual environments aside)."""
    skip = {".git", ".mirror", ".venv", "node_modules"}
    return sorted(
        p
        for pattern in ("*Dockerfile*", "*Containerfile*", "*.dockerfile")
        for p in REPO.rglob(pattern)
        if p.is_file() and not skip.intersection(p.relative_to(REPO).parts)
    )
