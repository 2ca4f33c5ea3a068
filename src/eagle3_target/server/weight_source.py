"""Where refreshed weights come from: a checkpoint folder in Hugging Face's safetensors layout, on a local
path or under s3://. It is read whole into host memory and checked against the weights that serve before
anything that serves is touched (refresh.py); every failure is an InvalidInput naming what is wrong."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from eagle3_target.protocol.model_info import config_digest, defining_config

from .errors import InvalidInput

S3 = "s3://"
KEPT_SUFFIXES = (".safetensors", ".json")  # the weights, config.json and the shard index


# What a rank of a split replica reads of each tensor it holds: a block (one slice per dimension), or all of it
Parts = Mapping[str, tuple[slice, ...] | None]


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
        check_layout(_layout(files), served, source)
        tensors = {name: t for f in files for name, t in _tensors(f, parts)}
    except (SafetensorError, OSError) as exc:
        raise InvalidInput("source_corrupt", f"{source}: cannot read it: {_line(exc)}") from None
    check_finite(tensors, source)
    return tensors


REDUCIBLE = (torch.float64, torch.float32, torch.float16, torch.bfloat16)  # the floating dtypes aminmax takes


def check_finite(tensors: Mapping[str, torch.Tensor], source: str) -> None:
    bad = [n for n, t in tensors.items() if t.is_floating_point() and not _finite(t)]
    if bad:
        raise InvalidInput("source_corrupt", f"{source}: {_some(bad)} hold NaN or infinite values")


def _finite(tensor: torch.Tensor) -> bool:
    """No NaN or infinity. A finite sum proves it (NaN and infinities propagate through addition), and a sum
    reads the tensor faster than any other reduction; only a sum that overflowed (or a bad tensor) is looked at
    again, its least and greatest value being finite exactly when every value is."""
    if tensor.numel() == 0:
        return True
    if tensor.dtype not in REDUCIBLE:  # float8, which neither sum nor aminmax takes: exact in bfloat16
        return _finite(tensor.to(torch.bfloat16))
    if torch.isfinite(tensor.sum()):
        return True
    low, high = torch.aminmax(tensor)
    return bool(torch.isfinite(low) and torch.isfinite(high))


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


def _layout(files: list[Path]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor's shape and dtype from the files' headers: nothing of the data is read yet."""
    layout: dict[str, tuple[tuple[int, ...], str]] = {}
    for path in files:
        with safe_open(path, framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 - safe_open is not iterable
                if name in layout:
                    raise InvalidInput("source_corrupt", f"tensor {name!r} is in two files")
                piece = fh.get_slice(name)
                layout[name] = (tuple(piece.get_shape()), piece.get_dtype())
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


def _tensors(path: Path, parts: Parts | None):
    with safe_open(path, framework="pt") as fh:
        for name in fh.keys():  # noqa: SIM118 - safe_open is not iterable
            if parts is not None and name not in parts:
                continue  # another rank's
            block = None if parts is None else parts[name]
            yield name, fh.get_tensor(name) if block is None else fh.get_slice(name)[block]


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
