"""``precompile export`` / ``import``: artifacts moved between caches as one verified file (an air-gapped cluster).

A bundle carries, for each exported key, the ref's value and every blob reachable from it: the blob the ref names
(the manifest) and, recursively, every stored blob that a JSON blob among them names by digest (a manifest's
parts; a signature stored as a blob next to the manifest).  So whatever the cache stores for a ref travels with
it.  Layout (docs/format.md, "As a bundle")::

    magic     8 bytes   b"\\x89PCBNDL\\n"
    version   u32 LE    bundle version (1)
    header    u64 LE length, then JSON: {"bundle": 1, "precompile", "created", "refs": [{"key", "digest"}], "blobs": N}
    blob x N  32-byte raw sha256 of the uncompressed bytes, u64 LE length, a zstd frame of that length
    end       b"PCBNDEND", then the 32-byte sha256 of every byte before b"PCBNDEND"

:func:`check_bundle` checks everything (the checksum, every length against the file size, every blob against its
digest, that every ref's blobs are all there and that a manifest names its ref's key); :func:`import_bundle` then
writes every blob, then the refs.  A bundle that fails any check is refused whole, before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from cache_backends.base import HEX64, MISS, Cache, decompress_frame, digest_bytes
from precompile.errors import ArtifactFormatError, ArtifactNotFoundError

MAGIC = b"\x89PCBNDL\n"
END = b"PCBNDEND"
VERSION = 1
#: Largest header accepted, bytes (a header lists refs: ~140 bytes each).
MAX_HEADER = 64 << 20

_BLOB_HEAD = struct.Struct("<32sQ")


def _digests_in(data: bytes) -> set[str]:
    """Every 64-hex string in ``data`` when it is a JSON object (keys and values, at any depth), else none."""
    if not data.lstrip()[:1] == b"{":
        return set()
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return set()
    found: set[str] = set()
    stack: list[Any] = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            found.update(k for k in item if isinstance(k, str) and HEX64.match(k))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and HEX64.match(item):
            found.add(item)
    return found


def _required(data: bytes) -> set[str]:
    """The parts a manifest says it has (its ``blobs`` object): these must be in a bundle."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return set()
    blobs = doc.get("blobs") if isinstance(doc, dict) else None
    return {d for d in blobs if isinstance(d, str) and HEX64.match(d)} if isinstance(blobs, dict) else set()


def _manifest_key(data: bytes) -> str | None:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc.get("key") if isinstance(doc, dict) and "schema" in doc and isinstance(doc.get("key"), str) else None


def closure(cache: Cache, key: str) -> tuple[str, list[str]]:
    """``(digest the ref names, every digest reachable from it)`` for ``key`` (see module docstring).

    Raises:
        ArtifactNotFoundError: no ref for ``key``, a blob the ref or its manifest names is missing or damaged, or
            the manifest names another key (run ``precompile verify``).
        CacheUnavailableError: the cache cannot be read.
    """
    digest = cache.get_ref(key)
    if digest is MISS:
        raise ArtifactNotFoundError(f"no artifact {key} in {cache.url}")
    order: list[str] = []
    seen = {digest}
    todo = [digest]
    while todo:
        d = todo.pop()
        data = cache.get_blob(d)
        if data is MISS:
            raise ArtifactNotFoundError(f"artifact {key[:12]} in {cache.url} is incomplete: blob {d[:12]} is missing "
                                        "or damaged (precompile verify --fix drops it)")
        order.append(d)
        if d == digest:
            named = _manifest_key(data)  # type: ignore[arg-type]
            if named is not None and named != key:
                raise ArtifactNotFoundError(f"ref {key[:12]} in {cache.url} names the manifest of {named[:12]}")
        required = _required(data)  # type: ignore[arg-type]
        optional = sorted(_digests_in(data) - seen - required)  # type: ignore[arg-type]
        present = cache.has_blobs(optional) if optional else {}
        for n in sorted(required - seen) + [o for o in optional if present.get(o)]:
            seen.add(n)
            todo.append(n)
    return digest, order


@dataclass
class Exported:
    """What :func:`export` wrote: the refs, the number of blobs and the file's size in bytes."""

    path: str
    refs: list[dict[str, str]]
    blobs: int
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "refs": self.refs, "blobs": self.blobs, "bytes": self.bytes}


def export(cache: Cache, keys: list[str], path: str | os.PathLike[str]) -> Exported:
    """Write the artifacts ``keys`` (full keys) of ``cache`` into one bundle file at ``path`` (atomically).

    Raises:
        ArtifactNotFoundError: a key is not stored or is incomplete (nothing is written).
        FileNotFoundError: the directory of ``path`` does not exist.
        CacheUnavailableError: the cache cannot be read.
        OSError: the file cannot be written.
    """
    import zstandard

    path = Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"cannot write bundle {path}: directory {path.parent} does not exist")
    refs, blob_order = [], []
    for key in dict.fromkeys(keys):
        digest, names = closure(cache, key)
        refs.append({"key": key, "digest": digest})
        blob_order.extend(n for n in names if n not in blob_order)
    header = json.dumps({"bundle": VERSION, "precompile": _version(), "created": datetime.now(timezone.utc).isoformat(),
                         "refs": refs, "blobs": len(blob_order)}, sort_keys=True).encode()
    comp = zstandard.ZstdCompressor(level=3)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.incomplete")
    hasher = hashlib.sha256()
    try:
        with open(tmp, "wb") as f:
            def put(b: bytes) -> None:
                hasher.update(b)
                f.write(b)

            put(MAGIC + struct.pack("<I", VERSION) + struct.pack("<Q", len(header)) + header)
            for d in blob_order:
                data = cache.get_blob(d)
                if data is MISS:
                    raise ArtifactNotFoundError(f"blob {d[:12]} vanished from {cache.url} during the export")
                frame = comp.compress(data)  # type: ignore[arg-type]
                put(_BLOB_HEAD.pack(bytes.fromhex(d), len(frame)) + frame)
            f.write(END + hasher.digest())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return Exported(str(path), refs, len(blob_order), path.stat().st_size)


def _version() -> str:
    from precompile._version import __version__

    return __version__


def _blobs(f: IO[bytes], path: Path, count: int, end: int) -> Iterator[tuple[str, bytes]]:
    """``(digest, bytes)`` of each blob, verified; the file is positioned after the header."""
    for i in range(count):
        head = f.read(_BLOB_HEAD.size)
        if len(head) < _BLOB_HEAD.size or f.tell() > end:
            raise ArtifactFormatError(f"bundle {path} is truncated at blob {i} of {count}")
        raw_digest, length = _BLOB_HEAD.unpack(head)
        if length > end - f.tell():
            raise ArtifactFormatError(f"bundle {path} is corrupt: blob {i} claims {length} bytes, past the end")
        digest = raw_digest.hex()
        try:
            data = decompress_frame(f.read(length))
        except ValueError as err:
            raise ArtifactFormatError(f"bundle {path} is corrupt: blob {digest[:12]} does not decompress "
                                      f"({err})") from err
        if digest_bytes(data) != digest:
            raise ArtifactFormatError(f"bundle {path} is corrupt: blob {digest[:12]} does not match its digest")
        yield digest, data


def read_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], int]:
    """Check a bundle's framing and checksum; return its header and the offset of its first blob.

    Raises:
        ArtifactFormatError: not a bundle, another version, truncated, a length past the end, or a checksum that
            does not match (tampered or damaged).
        FileNotFoundError: no file at ``path``.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ArtifactFormatError(f"{path} is not a precompile bundle (it does not start with the bundle magic; "
                                      "write one with precompile export)")
        if size < len(MAGIC) + 12 + len(END) + 32:
            raise ArtifactFormatError(f"bundle {path} is truncated ({size} bytes)")
        (version,) = struct.unpack("<I", f.read(4))
        if version != VERSION:
            raise ArtifactFormatError(f"bundle {path} has version {version}; this precompile reads version {VERSION}")
        (hlen,) = struct.unpack("<Q", f.read(8))
        body_end = size - len(END) - 32
        if hlen > min(MAX_HEADER, body_end - f.tell()):
            raise ArtifactFormatError(f"bundle {path} is corrupt: its header claims {hlen} bytes")
        hasher = hashlib.sha256(MAGIC + struct.pack("<I", version) + struct.pack("<Q", hlen))
        raw = f.read(hlen)
        hasher.update(raw)
        first = f.tell()
        remaining = body_end - first
        while remaining > 0:
            chunk = f.read(min(remaining, 1 << 20))
            hasher.update(chunk)
            remaining -= len(chunk)
        if f.read(len(END)) != END or f.read(32) != hasher.digest():
            raise ArtifactFormatError(f"bundle {path} is corrupt: its checksum does not match its content (tampered "
                                      "with, damaged or cut short); nothing was imported")
    try:
        header = json.loads(raw)
        count, refs = header["blobs"], header["refs"]
        well_formed = (isinstance(count, int) and 0 <= count <= (body_end - first) // _BLOB_HEAD.size
                       and isinstance(refs, list)
                       and all(HEX64.match(r["key"]) and HEX64.match(r["digest"]) for r in refs))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise ArtifactFormatError(f"bundle {path} has a malformed header ({type(err).__name__}: {err})") from err
    if not well_formed:
        raise ArtifactFormatError(f"bundle {path} has a malformed header (a blob count beyond its size, or a ref "
                                  "that is not two 64-hex digests)")
    return header, first


@dataclass
class Imported:
    """One ref of an import: its key and ``outcome`` (``"imported"``, ``"present"`` or ``"replaced"``)."""

    key: str
    digest: str
    outcome: str


@dataclass(frozen=True)
class CheckedBundle:
    """A bundle file that passed every check of :func:`check_bundle`, which makes it.

    Attributes:
        path: the file.
        header: its parsed header (``refs``, ``blobs``...).
        first: offset of its first blob.
        end: offset of its end marker.
    """

    path: Path
    header: dict[str, Any]
    first: int
    end: int


def check_bundle(path: str | os.PathLike[str], progress: Callable[[int, int], None] | None = None) -> CheckedBundle:
    """Check the bundle at ``path`` whole, writing nothing: its framing and checksum (:func:`read_header`), every
    blob against its digest, that each ref's manifest and every part it lists are there, and that a manifest
    names its ref's key.

    Args:
        progress: called ``(blobs checked, blobs)`` after each blob.

    Raises:
        ArtifactFormatError: the bundle fails a check.
        FileNotFoundError: no file at ``path``.
    """
    path = Path(path)
    header, first = read_header(path)
    count = header["blobs"]
    end = path.stat().st_size - len(END) - 32
    have: set[str] = set()
    targets = {r["digest"] for r in header["refs"]}
    docs: dict[str, bytes] = {}
    with open(path, "rb") as f:
        f.seek(first)
        for digest, data in _blobs(f, path, count, end):
            have.add(digest)
            if digest in targets:
                docs[digest] = data
            if progress:
                progress(len(have), count)
    for ref in header["refs"]:
        data = docs.get(ref["digest"])
        if data is None:
            raise ArtifactFormatError(f"bundle {path} lacks the manifest of {ref['key'][:12]}")
        missing = _required(data) - have
        if missing:
            raise ArtifactFormatError(f"bundle {path} lacks {len(missing)} part(s) of artifact {ref['key'][:12]}")
        named = _manifest_key(data)
        if named is not None and named != ref["key"]:
            raise ArtifactFormatError(f"bundle {path} maps key {ref['key'][:12]} to the manifest of {named[:12]}")
    return CheckedBundle(path, header, first, end)


def import_bundle(bundle: CheckedBundle, cache: Cache,
                  progress: Callable[[int, int], None] | None = None) -> tuple[list[Imported], int]:
    """Write the blobs, then the refs, of a bundle that passed :func:`check_bundle` into ``cache``.  Each blob is
    verified against its digest again as it is read back to be written.

    Args:
        progress: called ``(blobs written, blobs)`` after each blob.

    Returns:
        ``(one Imported per ref, blobs written)``.

    Raises:
        ArtifactFormatError: a blob no longer matches its digest (the file changed since it was checked).
        FileNotFoundError: the file is gone.
        CacheReadOnlyError / CacheUnavailableError: the cache refused a write.
    """
    path, header, count = bundle.path, bundle.header, bundle.header["blobs"]
    written = 0
    with open(path, "rb") as f:
        f.seek(bundle.first)
        for i, (digest, data) in enumerate(_blobs(f, path, count, bundle.end), 1):
            cache.put_blob(data, digest)
            written += 1
            if progress:
                progress(i, count)
    out = []
    for ref in header["refs"]:
        before = cache.get_ref(ref["key"])
        if before == ref["digest"]:
            out.append(Imported(ref["key"], ref["digest"], "present"))
            continue
        cache.set_ref(ref["key"], ref["digest"])
        out.append(Imported(ref["key"], ref["digest"], "imported" if before is MISS else "replaced"))
    return out, written
