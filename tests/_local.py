"""What the LocalCache tests share: two ref keys, a blob's file, a stored artifact, file ages."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from cache_backends.base import Cache
from cache_backends.local.cache import LocalCache

KEY = "1" * 64
KEY2 = "2" * 64


def blob_file(cache: LocalCache, digest: str) -> Path:
    return cache.root / "blob" / digest[:2] / digest[2:]


def store_artifact(cache: Cache, key: str, parts: list[bytes]) -> tuple[str, list[str]]:
    """Write ``parts`` and a manifest naming them, then the ref; returns (manifest digest, part digests)."""
    digests = [cache.put_blob(p) for p in parts]
    manifest = json.dumps({"schema": 1, "blobs": {d: {"size": len(p)} for d, p in zip(digests, parts)}}).encode()
    mdigest = cache.put_blob(manifest)
    cache.set_ref(key, mdigest)
    return mdigest, digests


def set_mtime(path: Path, age_s: float) -> None:
    t = time.time() - age_s
    os.utime(path, (t, t))
