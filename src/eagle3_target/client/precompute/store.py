"""The cache's files on any fsspec filesystem: a local path or PVC, or object storage (s3://...).

Every file is written whole under a temporary name, then renamed, so a reader (or a resumed run) never
sees part of a shard: on a local filesystem the rename is atomic; on object storage the final object
appears only when its copy completes. Temporary names never match a shard's name.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import fsspec

from .cache import MANIFEST, SHARD

# What write() leaves behind when its process is killed mid-shard.
PARTIAL_SHARD = re.compile(r"^\.shard-(\d{6})\.safetensors\.[0-9a-f]{32}\.tmp$")


class CacheStore:
    def __init__(self, url: str):
        self.url = url
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.root = self.root.rstrip("/") or "/"

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def names(self) -> list[str]:
        if not self.fs.isdir(self.root):
            return []
        return [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False, refresh=True)]

    def shard_indices(self) -> set[int]:
        """The shards already complete in the cache."""
        return {int(m.group(1)) for m in map(SHARD.match, self.names()) if m}

    def remove_partial_shards(self, mine) -> list[str]:
        """Delete the temporaries a killed writer left of the shards ``mine(index)`` accepts (no other worker
        writes those); returns their names."""
        stale = [n for n in self.names() if (m := PARTIAL_SHARD.match(n)) and mine(int(m.group(1)))]
        for name in stale:
            self.fs.rm(self.path(name))
        return stale

    def read_manifest(self) -> dict[str, Any] | None:
        return self.read_json(MANIFEST)

    def read_json(self, name: str) -> dict[str, Any] | None:
        if not self.fs.exists(self.path(name)):
            return None
        with self.fs.open(self.path(name), "rb") as f:
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
