"""Finding stored artifacts: a key or a unique key prefix in a cache, or an artifact file or directory.

The command line and :func:`precompile.load` accept the same things: a 64-hex key, a unique prefix of at least
:data:`MIN_PREFIX` hex characters, or a path written by :meth:`precompile.Artifact.save`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cache_backends.base import MISS, Cache
from cache_backends.bounded import MAX_BLOB_BYTES, MAX_MANIFEST_BYTES, loads_json
from precompile.errors import AmbiguousKeyError, ArtifactNotFoundError

#: Fewest hex characters a key prefix must have.
MIN_PREFIX = 6
#: Matches listed in the message of an ambiguous prefix.
SHOW_MATCHES = 10

_HEX = re.compile(r"^[0-9a-f]+$")


def is_key_prefix(text: str) -> bool:
    """True if ``text`` is 6 to 64 lowercase hex characters (a key or a key prefix)."""
    return MIN_PREFIX <= len(text) <= 64 and bool(_HEX.match(text))


def resolve_key(cache: Cache, text: str) -> str:
    """The full key ``text`` names in ``cache``: ``text`` itself when it is 64 hex characters (present or not),
    else the one stored key that starts with it.

    Raises:
        ArtifactNotFoundError: ``text`` is not hex of 6 to 64 characters, or no stored key starts with it.
        AmbiguousKeyError: several stored keys start with it (the message lists them).
        CacheUnavailableError: the cache cannot list its refs.
    """
    if not is_key_prefix(text):
        raise ArtifactNotFoundError(f"{text!r} is not an artifact key (64 hex characters) nor a key prefix of "
                                    f"{MIN_PREFIX}+ hex characters")
    if len(text) == 64:
        return text
    matches = sorted({k for k, _ in cache.iter_refs() if k.startswith(text)})
    if not matches:
        raise ArtifactNotFoundError(f"no artifact key in {cache.url} starts with {text!r}")
    if len(matches) > 1:
        shown = ", ".join(matches[:SHOW_MATCHES]) + (f" and {len(matches) - SHOW_MATCHES} more"
                                                     if len(matches) > SHOW_MATCHES else "")
        raise AmbiguousKeyError(f"key prefix {text!r} matches {len(matches)} artifacts in {cache.url}: {shown}; "
                                "give more characters", matches)
    return matches[0]


@dataclass
class Source:
    """One artifact to look at: its manifest (a dict), where it came from, and a reader of its blobs.

    Attributes:
        key: the artifact key.
        manifest: the manifest as parsed JSON.
        where: ``"<cache url> ref <key>"`` or the path.
        read: ``read(digest) -> bytes or None`` (verified by the cache or the file reader).
    """

    key: str
    manifest: dict[str, Any]
    where: str
    read: Callable[[str], bytes | None]

    def part_text(self, digest: str | None) -> str | None:
        """A part's bytes decoded as UTF-8, or None when absent."""
        data = self.read(digest) if digest else None
        return data.decode("utf-8", "replace") if data is not None else None


def stored_manifest(cache: Cache, key: str) -> dict[str, Any]:
    """The manifest stored under ``key`` (parsed JSON, not checked further).

    Raises:
        ArtifactNotFoundError: no ref, or its manifest blob is missing, damaged or not JSON.
        CacheUnavailableError: the cache cannot be read.
    """
    digest = cache.get_ref(key)
    raw = cache.get_blob(digest, MAX_MANIFEST_BYTES) if digest is not MISS else MISS
    if raw is MISS:
        if digest is MISS:
            raise ArtifactNotFoundError(f"no artifact {key} in {cache.url}")
        raise ArtifactNotFoundError(f"the manifest of artifact {key} is missing, corrupt or over {MAX_MANIFEST_BYTES} "
                                    f"bytes in {cache.url}")
    try:
        doc = loads_json(raw, MAX_MANIFEST_BYTES, "manifest")
    except (ValueError, UnicodeDecodeError) as err:  # InputLimitError (too deep) is a ValueError
        raise ArtifactNotFoundError(f"the manifest of {key} in {cache.url} is not JSON: {err}") from err
    if not isinstance(doc, dict):
        raise ArtifactNotFoundError(f"the manifest of {key} in {cache.url} is not a JSON object")
    return doc


def recorded_size(manifest: dict[str, Any], digest: str) -> int:
    """The size in bytes a parsed (not yet checked) manifest records for part ``digest``: the most a read of it
    accepts; :data:`~cache_backends.bounded.MAX_BLOB_BYTES` where it records none."""
    info = manifest.get("blobs", {}).get(digest) if isinstance(manifest.get("blobs"), dict) else None
    size = info.get("size") if isinstance(info, dict) else None
    return size if type(size) is int and 0 <= size <= MAX_BLOB_BYTES else MAX_BLOB_BYTES


def from_cache(cache: Cache, text: str) -> Source:
    """The artifact ``text`` (a key or unique prefix) names in ``cache``.

    Raises:
        ArtifactNotFoundError / AmbiguousKeyError: as :func:`resolve_key` and :func:`stored_manifest`.
    """
    key = resolve_key(cache, text)
    manifest = stored_manifest(cache, key)

    def read(digest: str) -> bytes | None:
        got = cache.get_blob(digest, recorded_size(manifest, digest))
        return None if got is MISS else got  # type: ignore[return-value]

    return Source(key, manifest, f"{cache.url} ref {key}", read)


def from_path(path: str | os.PathLike[str]) -> Source | None:
    """The artifact saved at ``path`` (a ``.pc`` file or an unpacked directory), or None if nothing is there.

    Raises:
        ArtifactFormatError: something is there but it is not an intact artifact.
        NotRegularFileError: it is a FIFO, a device or a socket (nothing is read from it).
        InputLimitError: its manifest or a part is larger than the format or the manifest allows.
    """
    from precompile.artifact import formats

    p = Path(path)
    if p.is_dir():
        manifest, blobs = formats.read_unpacked(p)
    elif os.path.exists(p):  # a FIFO, a device: read_binary refuses it unread (NotRegularFileError)
        manifest, blobs = formats.read_binary(p)
    else:
        return None
    return Source(manifest.key, manifest.to_dict(), str(p), blobs.get)


def open_target(target: str, cache: Cache | Callable[[], Cache]) -> Source:
    """An artifact path, else a key or unique key prefix in ``cache`` (or in the cache ``cache()`` opens, so a
    path needs no cache).

    Raises:
        ArtifactFormatError: ``target`` is a path to something that is not an intact artifact.
        ArtifactNotFoundError / AmbiguousKeyError: as :func:`from_cache`.
    """
    found = from_path(target) if not is_key_prefix(target) or os.path.exists(target) else None
    if found is not None:
        return found
    if not is_key_prefix(target):
        raise ArtifactNotFoundError(f"{target!r} is not an artifact path, nor a key (or unique key prefix of "
                                    f"{MIN_PREFIX}+ hex characters)")
    return from_cache(cache if isinstance(cache, Cache) else cache(), target)


def stored_manifests(cache: Cache) -> list[tuple[str, dict[str, Any] | None]]:
    """``(key, manifest or None)`` for every ref, sorted by key; None where the manifest is missing, damaged or
    not a JSON object.

    Raises:
        CacheUnavailableError: the cache cannot be listed or read.
    """
    refs = sorted(cache.iter_refs())
    blobs = cache.get_blobs(list(dict.fromkeys(d for _, d in refs)), MAX_MANIFEST_BYTES)
    out: list[tuple[str, dict[str, Any] | None]] = []
    for key, digest in refs:
        raw = blobs.get(digest, MISS)
        doc = None
        if raw is not MISS:
            try:
                doc = loads_json(raw, MAX_MANIFEST_BYTES, "manifest")  # type: ignore[arg-type]
            except (ValueError, UnicodeDecodeError):  # InputLimitError (too deep) is a ValueError
                doc = None
        out.append((key, doc if isinstance(doc, dict) else None))
    return out


__all__ = ["MIN_PREFIX", "Source", "from_cache", "from_path", "is_key_prefix", "open_target", "resolve_key",
           "stored_manifest", "stored_manifests"]
