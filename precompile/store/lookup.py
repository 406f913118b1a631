"""Finding stored artifacts: a key or a unique key prefix in a cache, or an artifact file or directory.

The command line and :func:`precompile.load` accept the same things: a 64-hex key, a unique prefix of at least
:data:`MIN_PREFIX` hex characters, or a path written by :meth:`precompile.Artifact.save`.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cache_backends.base import MISS, Cache
from cache_backends.bounded import MAX_BLOB_BYTES, MAX_MANIFEST_BYTES, loads_json
from precompile.errors import (
    AmbiguousKeyError,
    ArtifactFormatError,
    ArtifactNotFoundError,
    NotAnArtifactPathError,
    NotRegularFileError,
)

#: Fewest hex characters a key prefix must have.
MIN_PREFIX = 6
#: Matches listed in the message of an ambiguous prefix.
SHOW_MATCHES = 10

_HEX = re.compile(r"^[0-9a-f]+\Z")


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
        problem: why the manifest is malformed (:func:`problem`), or None when it is well formed.
    """

    key: str
    manifest: dict[str, Any]
    where: str
    read: Callable[[str], bytes | None]
    problem: str | None = None

    def part_text(self, digest: str | None) -> str | None:
        """A part's bytes decoded as UTF-8, or None when absent."""
        data = self.read(digest) if digest else None
        return data.decode("utf-8", "replace") if data is not None else None


def parse_manifest(raw: bytes, what: str) -> dict[str, Any]:
    """A stored manifest's bytes parsed as a JSON object, bounded (:data:`MAX_MANIFEST_BYTES`, and the depth of
    :func:`cache_backends.bounded.loads_json`).  Its structure is not checked (see :func:`problem`).

    Raises:
        ArtifactFormatError: larger or deeper than the bounds, not UTF-8 JSON, or not a JSON object.
    """
    try:
        doc = loads_json(raw, MAX_MANIFEST_BYTES, what)
    except ValueError as err:  # InputLimitError, JSONDecodeError, UnicodeDecodeError
        raise ArtifactFormatError(f"{what} is not a readable JSON manifest: {err}") from err
    if not isinstance(doc, dict):
        raise ArtifactFormatError(f"{what} is not a JSON object ({type(doc).__name__})")
    return doc


def problem(doc: Any) -> str | None:
    """Why a parsed manifest is malformed, in a sentence, or None when it is well formed: a graph manifest, a
    whole-function manifest or a record (by its ``kind``), checked as a load checks it, and each placeholder an
    object with a string ``name`` and ``kind`` (what every listing reads).  Never raises."""
    from precompile.manifest.function_manifest import FunctionManifest
    from precompile.manifest.manifest import Manifest
    from precompile.manifest.record_manifest import RecordManifest

    if not isinstance(doc, dict):
        return f"the manifest is not a JSON object ({type(doc).__name__})"
    kind = doc.get("kind")
    parse = Manifest.from_dict if kind is None else RecordManifest.from_dict if kind == "record" \
        else FunctionManifest.from_dict
    try:
        parse(doc)
    except ArtifactFormatError as err:  # UnsafePathError too
        return str(err)
    if kind is None:
        for i, p in enumerate(doc["placeholders"]):
            if not (isinstance(p, dict) and isinstance(p.get("name"), str) and isinstance(p.get("kind"), str)):
                return f"manifest field placeholders[{i}] is not a placeholder (an object with a name and a kind)"
    return None


def stored_manifest(cache: Cache, key: str) -> dict[str, Any]:
    """The manifest stored under ``key`` (parsed JSON, bounded; its structure is not checked: see :func:`problem`).

    Raises:
        ArtifactNotFoundError: no ref, or its manifest blob is missing or damaged.
        ArtifactFormatError: the manifest is not a JSON object, or is larger or deeper than the bounds.
        CacheUnavailableError: the cache cannot be read.
    """
    digest = cache.get_ref(key)
    raw = cache.get_blob(digest, MAX_MANIFEST_BYTES) if digest is not MISS else MISS
    if raw is MISS:
        if digest is MISS:
            raise ArtifactNotFoundError(f"no artifact {key} in {cache.url}")
        raise ArtifactNotFoundError(f"the manifest of artifact {key} is missing, corrupt or over {MAX_MANIFEST_BYTES} "
                                    f"bytes in {cache.url}")
    return parse_manifest(raw, f"the manifest of {key} in {cache.url}")  # type: ignore[arg-type]


def recorded_size(manifest: dict[str, Any], digest: str) -> int:
    """The size in bytes a parsed (not yet checked) manifest records for part ``digest``: the most a read of it
    accepts; :data:`~cache_backends.bounded.MAX_BLOB_BYTES` where it records none."""
    info = manifest.get("blobs", {}).get(digest) if isinstance(manifest.get("blobs"), dict) else None
    size = info.get("size") if isinstance(info, dict) else None
    return size if type(size) is int and 0 <= size <= MAX_BLOB_BYTES else MAX_BLOB_BYTES


def from_cache(cache: Cache, text: str) -> Source:
    """The artifact ``text`` (a key or unique prefix) names in ``cache``; a malformed manifest is returned too,
    with its :attr:`Source.problem`.

    Raises:
        ArtifactNotFoundError / AmbiguousKeyError / ArtifactFormatError: as :func:`resolve_key` and
            :func:`stored_manifest`.
    """
    key = resolve_key(cache, text)
    manifest = stored_manifest(cache, key)

    def read(digest: str) -> bytes | None:
        got = cache.get_blob(digest, recorded_size(manifest, digest))
        return None if got is MISS else got  # type: ignore[return-value]

    return Source(key, manifest, f"{cache.url} ref {key}", read, problem(manifest))


def from_path(path: str | os.PathLike[str]) -> Source | None:
    """The artifact saved at ``path`` (a ``.pc`` file or an unpacked directory), or None if nothing is there.

    Raises:
        NotAnArtifactPathError: something is there that cannot be an artifact (a FIFO, a device, a socket, a
            directory without ``manifest.json``, a file that cannot be read, such as ``/proc/self/mem``); nothing
            is read from a FIFO or a device.
        ArtifactFormatError: it may be an artifact but it is not an intact one.
        InputLimitError: its manifest or a part is larger than the format or the manifest allows.
    """
    from precompile.manifest import formats

    p = Path(path)
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as err:
        raise NotAnArtifactPathError(f"{p} cannot be examined: {err.strerror or err}") from err
    if stat.S_ISDIR(mode) and not (p / "manifest.json").exists():
        raise NotAnArtifactPathError(f"{p} is a directory without manifest.json: not an unpacked precompile artifact")
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise NotAnArtifactPathError(f"{p} is not a regular file or a directory, so not a precompile artifact; "
                                     "nothing was read from it")
    try:
        manifest, blobs = formats.read_unpacked(p) if stat.S_ISDIR(mode) else formats.read_binary(p)
    except NotAnArtifactPathError:
        raise
    except ArtifactFormatError as err:
        if isinstance(err.__cause__, OSError) and not isinstance(err.__cause__, NotRegularFileError):
            # EIO from /proc/self/mem...: nothing an artifact can be read from, not a damaged artifact
            raise NotAnArtifactPathError(f"{p} cannot be read as a precompile artifact: {err.__cause__}") from err
        raise
    except OSError as err:  # EIO from /proc/self/mem, EACCES...: nothing an artifact can be read from
        raise NotAnArtifactPathError(f"{p} cannot be read as a precompile artifact: {err.strerror or err}") from err
    return Source(manifest.key, manifest.to_dict(), str(p), blobs.get)


def open_target(target: str, cache: Cache | Callable[[], Cache]) -> Source:
    """An artifact path, else a key or unique key prefix in ``cache`` (or in the cache ``cache()`` opens, so a
    path needs no cache).

    Raises:
        NotAnArtifactPathError: ``target`` is a path to something that cannot be an artifact.
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


@dataclass(frozen=True)
class Entry:
    """One stored ref as a listing sees it.

    Attributes:
        key: the ref's key.
        manifest: its manifest (parsed JSON), or None when it could not be read or parsed.
        problem: None for a well-formed manifest, else why not: missing or damaged, not JSON, or malformed
            (:func:`problem`).
    """

    key: str
    manifest: dict[str, Any] | None
    problem: str | None


#: Manifests read per round trip by :func:`iter_entries` (a few MB at most: manifests are KBs).
ENTRY_BATCH = 256


def iter_entries(cache: Cache) -> Iterator[Entry]:
    """Every ref of ``cache`` with its manifest and whether it is well formed, sorted by key, one at a time: the
    manifests are read :data:`ENTRY_BATCH` at a time and each is parsed once, so a listing of 100,000 refs holds
    one batch, not the cache.  One malformed entry never hides the others.

    Raises:
        CacheUnavailableError: the cache cannot be listed or read.
    """
    refs = sorted(cache.iter_refs())
    for start in range(0, len(refs), ENTRY_BATCH):
        batch = refs[start:start + ENTRY_BATCH]
        blobs = cache.get_blobs(list(dict.fromkeys(d for _, d in batch)), MAX_MANIFEST_BYTES)
        for key, digest in batch:
            raw = blobs.get(digest, MISS)
            if raw is MISS:
                yield Entry(key, None, "manifest missing, corrupt or over its size bound")
                continue
            try:
                doc = parse_manifest(raw, "manifest")  # type: ignore[arg-type]
            except ArtifactFormatError as err:
                yield Entry(key, None, str(err))
                continue
            yield Entry(key, doc, problem(doc))


def stored_entries(cache: Cache) -> list[Entry]:
    """Every ref of ``cache`` with its manifest and whether it is well formed, sorted by key (:func:`iter_entries`,
    all kept).

    Raises:
        CacheUnavailableError: the cache cannot be listed or read.
    """
    return list(iter_entries(cache))


def stored_manifests(cache: Cache) -> list[tuple[str, dict[str, Any] | None]]:
    """``(key, manifest or None)`` for every ref, sorted by key; None where the manifest is missing, damaged,
    not a JSON object or malformed (:func:`stored_entries` says why), so that callers only meet well-formed ones.

    Raises:
        CacheUnavailableError: the cache cannot be listed or read.
    """
    return [(e.key, e.manifest if e.problem is None else None) for e in stored_entries(cache)]


__all__ = ["ENTRY_BATCH", "MAX_MANIFEST_BYTES", "MIN_PREFIX", "Entry", "Source", "from_cache", "from_path",
           "is_key_prefix", "iter_entries", "open_target", "parse_manifest", "problem", "resolve_key",
           "stored_entries", "stored_manifest", "stored_manifests"]
