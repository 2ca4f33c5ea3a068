"""Trainer-side client: finds target servers, spreads batches over them, and never loses one."""

from eagle3_target.protocol.encodings import EncodingError

from .backend import BatchHandle, RemoteTargetBackend, TargetBatch
from .connection import ServerConnection, ServerError
from .dispatch import BatchFailedError, ModelMismatchError, PoolOptions
from .endpoints import EndpointError

__all__ = [
    "BatchFailedError",
    "BatchHandle",
    "EncodingError",
    "EndpointError",
    "ModelMismatchError",
    "PoolOptions",
    "RemoteTargetBackend",
    "ServerConnection",
    "ServerError",
    "TargetBatch",
]
