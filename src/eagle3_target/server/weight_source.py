"""Where refreshed weights come from: a checkpoint folder in Hugging Face's safetensors layout, on a local
path or under s3://. Its headers are checked against the weights that serve, then its tensors are read into
host memory of their own and checked for NaN (checkpoint_read.py), all before anything that serves is touched
(refresh.py); every failure is an InvalidInput naming what is wrong."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch

from eagle3_target.protocol.model_info import config_digest, defining_config

from .checkpoint_read import Entry, Parts, finite, read_file, read_header
from .errors import InvalidInput

S3 = "s3://"
KEPT_SUFFIXES = (".safetensors", ".json")  # the weights, config.json and the shard index


def read_source(
    source: str, served: Mapping[str, torch.Tensor], digest: str, parts: Parts | None = None
) -> dict[str, torch.Tensor]:
    """The checkpoint at ``source`` as host tensors by name, once it matches ``served`` (names, shapes,
    kinds) and, where it has a config.json, the served config (``digest``: RunnerInfo.config_digest).
    With ``parts``, only those tensors, each only its block: a rank's own part of the whole."""
    if source.startswith(S3):
        with tempfile.TemporaryDirectory(prefix="eagle3-refresh-") as folder:
            return read_folder(download(source, Path(folder)), served, digest, source, parts)
    return read_folder(Path(source), served, digest, source, parts)


def read_folder(
    folder: Path, served: Mapping[str, torch.Tensor], digest: str, source: str, parts: Parts | None = None
) -> dict[str, torch.Tensor]:
    if not folder.is_dir():
        raise InvalidInput("source_unreachable", f"{source}: no such folder here")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise InvalidInput("source_incomplete", f"{source} holds no *.safetensors file")
    if (folder / "config.json").is_file():
        _check_config(folder, digest, source)
    try:
        headers = {path: read_header(path, f"{source}/{path.name}") for path in files}
        check_layout(_layout(headers), served, source)
        return {
            name: t
            for path, header in headers.items()
            for name, t in read_file(path, header, parts, source).items()
        }
    except OSError as exc:
        raise InvalidInput("source_corrupt", f"{source}: cannot read it: {_line(exc)}") from None


def check_finite(tensors: Mapping[str, torch.Tensor], source: str) -> None:
    """Tensors that came whole (a broadcast): InvalidInput naming those that hold NaN or infinities."""
    bad = [n for n, t in tensors.items() if t.is_floating_point() and not finite(t)]
    if bad:
        raise InvalidInput("source_corrupt", f"{source}: {_some(bad)} hold NaN or infinite values")


def _check_config(folder: Path, digest: str, source: str) -> None:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(folder).to_diff_dict()
    except (OSError, ValueError, KeyError) as exc:
        raise InvalidInput("source_corrupt", f"{source}/config.json: {_line(exc)}") from None
    if config_digest(defining_config(config)) != digest:
        raise InvalidInput(
            "source_mismatch",
            f"{source}/config.json is not the served model's config (architecture "
            f"{config.get('architectures')}, digest {config_digest(config)}, serving {digest})",
        )


def _layout(headers: Mapping[Path, Mapping[str, Entry]]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor's shape and dtype from the files' headers: nothing of the data is read yet."""
    layout: dict[str, tuple[tuple[int, ...], str]] = {}
    for header in headers.values():
        for name, entry in header.items():
            if name in layout:
                raise InvalidInput("source_corrupt", f"tensor {name!r} is in two files")
            layout[name] = (entry.shape, entry.kind)
    return layout


def check_layout(layout: Mapping[str, tuple], served: Mapping[str, torch.Tensor], source: str) -> None:
    """Every served tensor in ``layout`` (name -> (shape, safetensors dtype)), nothing more, each of its
    shape and kind (floating or not); InvalidInput names the first that is not."""
    missing, extra = sorted(set(served) - set(layout)), sorted(set(layout) - set(served))
    if missing:
        raise InvalidInput("source_incomplete", f"{source} lacks {len(missing)} tensors: {_some(missing)}")
    if extra:
        raise InvalidInput(
            "source_mismatch", f"{source} holds tensors the served model has not: {_some(extra)}"
        )
    for name, (shape, dtype) in layout.items():
        want = served[name]
        if shape != tuple(want.shape):
            raise InvalidInput(
                "source_mismatch", f"{source}: {name} is {list(shape)}, the served one {list(want.shape)}"
            )
        if dtype.startswith(("F", "BF")) != want.is_floating_point():
            raise InvalidInput("source_mismatch", f"{source}: {name} is {dtype}, the served one {want.dtype}")


def download(source: str, folder: Path) -> Path:
    """The objects directly under ``s3://bucket/prefix`` that a checkpoint needs, into ``folder``
    (boto3, with its usual credentials and AWS_ENDPOINT_URL_S3)."""
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise InvalidInput("source_unreachable", "s3:// sources need boto3 (pip install boto3)") from None
    bucket, _, prefix = source.removeprefix(S3).partition("/")
    prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
    try:
        s3 = boto3.client("s3")
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
        keys = [k for k in keys if "/" not in k[len(prefix) :] and k.endswith(KEPT_SUFFIXES)]
        if not keys:
            raise InvalidInput("source_unreachable", f"{source}: no checkpoint files there")
        for key in keys:
            s3.download_file(bucket, key, str(folder / key[len(prefix) :]))
    except (BotoCoreError, ClientError) as exc:
        raise InvalidInput("source_unreachable", f"{source}: {_line(exc)}") from None
    return folder


def _some(names: list[str], shown: int = 3) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__
