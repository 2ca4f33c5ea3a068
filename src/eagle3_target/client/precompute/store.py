"""The cache's files on any fsspec filesystem: a local path or PVC, or object storage (s3://...).

Every file is written whole under a temporary name, then renamed, so a reader (or a resumed run) never
sees part of a shard: on a local filesystem the rename is atomic; on object storage the final object
appears only when its copy completes. Temporary names never match a shard's name.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import fsspec

from .cache import MANIFEST, SHARD


class CacheStore:
    def __init__(self, url: str):
        self.url = url
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.root = self.root.rstrip("/") or "/"

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def shard_indices(self) -> set[int]:
        """The shards already complete in the cache."""
        if not self.fs.isdir(self.root):
            return set()
        names = (p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False, refresh=True))
        return {int(m.group(1)) for m in map(SHARD.match, names) if m}

    def read_manifest(self) -> dict[str, Any] | None:
        if not self.fs.exists(self.path(MANIFEST)):
            return None
        with self.fs.open(self.path(MANIFEST), "rb") as f:
            return json.load(f)

    def write(self, name: str, data: bytes) -> None:
        """Write ``name`` atomically: a uniquely named temporary file, then a rename."""
        self.fs.makedirs(self.root, exist_ok=True)
        temporary = self.path(f".{name}.{uuid.uuid4().hex}.tmp")
        try:
            with self.fs.open(temporary, "wb") as f:
                f.write(data)
            self.fs.mv(temporary, self.path(name))
        except BaseException:
            if self.fs.exists(temporary):
                self.fs.rm(temporary)
            raise
