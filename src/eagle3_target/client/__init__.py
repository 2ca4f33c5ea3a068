"""Trainer-side client: finds target servers, spreads batches over them, and never loses one."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Imported on first use, so the CLI's import-light modules (cli_*.py) load without torch or aiohttp.
_EXPORTS = {
    "BatchFailedError": ".errors",
    "BatchHandle": ".backend",
    "BatchInputs": ".inputs",
    "CaptureHandle": ".capture",
    "EncodingError": "eagle3_target.protocol.encodings",
    "EndpointError": ".endpoints",
    "FeatureError": "eagle3_target.protocol.features",
    "Features": "eagle3_target.protocol.features",
    "ModelMismatchError": ".identity",
    "PoolOptions": ".options",
    "RemoteTargetBackend": ".backend",
    "RequestRejected": ".connection",
    "ServerConnection": ".connection",
    "ServerError": ".connection",
    "TargetBatch": ".backend",
}
__all__ = [
    "BatchFailedError",
    "BatchHandle",
    "BatchInputs",
    "CaptureHandle",
    "EncodingError",
    "EndpointError",
    "FeatureError",
    "Features",
    "ModelMismatchError",
    "PoolOptions",
    "RemoteTargetBackend",
    "RequestRejected",
    "ServerConnection",
    "ServerError",
    "TargetBatch",
]

if TYPE_CHECKING:
    from eagle3_target.protocol.encodings import EncodingError
    from eagle3_target.protocol.features import FeatureError, Features

    from .backend import BatchHandle, RemoteTargetBackend, TargetBatch
    from .capture import CaptureHandle
    from .connection import RequestRejected, ServerConnection, ServerError
    from .endpoints import EndpointError
    from .errors import BatchFailedError
    from .identity import ModelMismatchError
    from .inputs import BatchInputs
    from .options import PoolOptions


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
