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
from cache_backends.bounded import MAX_BLOB_BYTES, MAX_MANIFEST_BYTES, frame_bound, loads_json, open_regular, read_exact
from precompile.manifest.output import check_output, replacing
from precompile.errors import (ArtifactFormatError, ArtifactNotFoundError, InputLimitError, NotAnArtifactPathError,
                               NotRegularFileError)
from precompile.ops.bundle_json import digests_in, manifest_key, required_parts

MAGIC = b"\x89PCBNDL\n"
END = b"PCBNDEND"
VERSION = 1
#: Largest header accepted, bytes (a header lists refs: ~140 bytes each).
MAX_HEADER = 64 << 20

_BLOB_HEAD = struct.Struct("<32sQ")


def closure(cache: Cache, key: str) -> tuple[str, dict[str, int | None]]:
    """``(digest the ref names, {every digest reachable from it: its bound})`` for ``key`` (see module docstring),
    in the order found.  A digest's bound is the size in bytes its manifest records for it, the manifest bound for
    the manifest, ``None`` (the format's bound) for a part only another part names.

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
    bounds = {digest: MAX_MANIFEST_BYTES}  # a part no larger than the manifest that names it records
    while todo:
        d = todo.pop()
        data = cache.get_blob(d, bounds.get(d))
        if data is MISS:
            raise ArtifactNotFoundError(f"artifact {key[:12]} in {cache.url} is incomplete: blob {d[:12]} is missing, "
                                        "damaged or larger than its manifest records (precompile verify --fix drops "
                                        "it)")
        order.append(d)
        json_like = d == digest or data.lstrip()[:1] == b"{"  # type: ignore[union-attr]
        try:
            named = manifest_key(data) if d == digest else None  # type: ignore[arg-type]
            required = required_parts(data) if json_like else {}  # type: ignore[arg-type]
        except InputLimitError as err:  # the manifest's: refused; another JSON part's: it names no parts
            if d == digest:
                raise ArtifactNotFoundError(f"artifact {key[:12]} in {cache.url} has an unusable manifest: "
                                            f"{err}") from err
            required = {}
        if named is not None and named != key:
            raise ArtifactNotFoundError(f"ref {key[:12]} in {cache.url} names the manifest of {named[:12]}")
        optional = sorted(digests_in(data) - seen - set(required))  # type: ignore[arg-type]
        present = cache.has_blobs(optional) if optional else {}
        for n in sorted(set(required) - seen) + [o for o in optional if present.get(o)]:
            seen.add(n)
            todo.append(n)
            if n in required:
                bounds[n] = required[n]
    return digest, {d: bounds.get(d) for d in order}


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
        OutputPathError: ``path`` names a directory, a device, a FIFO, a socket or a symlink (nothing is written
            or replaced: :mod:`precompile.manifest.output`).
        FileNotFoundError: the directory of ``path`` does not exist.
        CacheUnavailableError: the cache cannot be read.
        OSError: the file cannot be written.
    """
    import zstandard

    path = check_output(path, "bundle")  # before the cache is read: a device or directory there is a mistake
    if not path.parent.is_dir():
        raise FileNotFoundError(f"cannot write bundle {path}: directory {path.parent} does not exist")
    refs: list[dict[str, str]] = []
    blob_order: dict[str, int | None] = {}  # digest -> the bound it is read with again, below
    for key in dict.fromkeys(keys):
        digest, names = closure(cache, key)
        refs.append({"key": key, "digest": digest})
        for n, bound in names.items():
            if n not in blob_order or blob_order[n] is None:
                blob_order[n] = bound
    header = json.dumps({"bundle": VERSION, "precompile": _version(), "created": datetime.now(timezone.utc).isoformat(),
                         "refs": refs, "blobs": len(blob_order)}, sort_keys=True).encode()
    comp = zstandard.ZstdCompressor(level=3)
    hasher = hashlib.sha256()
    with replacing(path, "bundle") as f:
        def put(b: bytes) -> None:
            hasher.update(b)
            f.write(b)

        put(MAGIC + struct.pack("<I", VERSION) + struct.pack("<Q", len(header)) + header)
        for d, bound in blob_order.items():
            data = cache.get_blob(d, bound)  # no larger than when the closure read it
            if data is MISS:
                raise ArtifactNotFoundError(f"blob {d[:12]} vanished from {cache.url} during the export (or "
                                            "was replaced by one larger than its manifest records)")
            frame = comp.compress(data)  # type: ignore[arg-type]
            put(_BLOB_HEAD.pack(bytes.fromhex(d), len(frame)) + frame)
        f.write(END + hasher.digest())
    return Exported(str(path), refs, len(blob_order), path.stat().st_size)


def _version() -> str:
    from precompile._version import __version__

    return __version__


def _blobs(f: IO[bytes], path: Path, count: int, end: int) -> Iterator[tuple[str, bytes]]:
    """``(digest, bytes)`` of each blob, verified and bounded (a frame at most what a blob of
    :data:`~cache_backends.bounded.MAX_BLOB_BYTES` is stored as, checked before it is read, and decompressed to at
    most that); the file is positioned after the header."""
    for i in range(count):
        head = f.read(_BLOB_HEAD.size)
        if len(head) < _BLOB_HEAD.size or f.tell() > end:
            raise ArtifactFormatError(f"bundle {path} is truncated at blob {i} of {count}")
        raw_digest, length = _BLOB_HEAD.unpack(head)
        if length > end - f.tell():
            raise ArtifactFormatError(f"bundle {path} is corrupt: blob {i} claims {length} bytes, past the end")
        digest = raw_digest.hex()
        try:
            if length > frame_bound(MAX_BLOB_BYTES):
                raise InputLimitError(f"its frame is {length} bytes, more than any blob is stored as")
            data = decompress_frame(read_exact(f, length))
        except InputLimitError as err:
            raise ArtifactFormatError(f"bundle {path} is refused: blob {digest[:12]} is over its bound "
                                      f"({err})") from err
        except ValueError as err:
            raise ArtifactFormatError(f"bundle {path} is corrupt: blob {digest[:12]} does not decompress "
                                      f"({err})") from err
        if digest_bytes(data) != digest:
            raise ArtifactFormatError(f"bundle {path} is corrupt: blob {digest[:12]} does not match its digest")
        yield digest, data


def read_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], int]:
    """Check a bundle's framing and checksum; return its header and the offset of its first blob.

    Raises:
        ArtifactFormatError: not a bundle, another version, truncated, a length past the end, a checksum that
            does not match (tampered or damaged), or a header over its bounds (:data:`MAX_HEADER` bytes, the JSON
            depth bound: chained to the :class:`~precompile.errors.InputLimitError`).
        FileNotFoundError: no file at ``path``.
        NotAnArtifactPathError: ``path`` is a FIFO, a device, a directory or a socket (never read; opening never
            blocks), or a file that cannot be read (``/proc/self/mem``).
    """
    path = Path(path)
    try:
        return _read_header(path)
    except FileNotFoundError:
        raise
    except OSError as err:  # NotRegularFileError (a FIFO, a device: never read), EIO from /proc/self/mem, EACCES
        why = err if isinstance(err, NotRegularFileError) else f"bundle {path} cannot be read ({err.strerror or err})"
        raise NotAnArtifactPathError(f"{why}; nothing was imported") from err


def _read_header(path: Path) -> tuple[dict[str, Any], int]:
    with open_regular(path, "bundle") as f:
        size = os.fstat(f.fileno()).st_size
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
        raw = read_exact(f, hlen)
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
        header = loads_json(raw, MAX_HEADER, "bundle header")  # nested too deep: InputLimitError, a ValueError
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
        manifests: each ref's manifest, parsed (``{key: manifest}``), for the trust check of an import.
    """

    path: Path
    header: dict[str, Any]
    first: int
    end: int
    manifests: dict[str, Any]


def check_bundle(path: str | os.PathLike[str], progress: Callable[[int, int], None] | None = None) -> CheckedBundle:
    """Check the bundle at ``path`` whole, writing nothing: its framing and checksum (:func:`read_header`), every
    blob against its digest, that each ref's manifest and every part it lists are there, and that a manifest
    names its ref's key.

    Args:
        progress: called ``(blobs checked, blobs)`` after each blob.

    Raises:
        ArtifactFormatError: the bundle fails a check, or a blob or a manifest is over its bound (chained to the
            :class:`~precompile.errors.InputLimitError`).
        FileNotFoundError: no file at ``path``.
        NotRegularFileError: ``path`` is not a regular file.
    """
    path = Path(path)
    header, first = read_header(path)
    count = header["blobs"]
    have: set[str] = set()
    targets = {r["digest"] for r in header["refs"]}
    docs: dict[str, bytes] = {}
    with open_regular(path, "bundle") as f:
        end = os.fstat(f.fileno()).st_size - len(END) - 32
        f.seek(first)
        for digest, data in _blobs(f, path, count, end):
            have.add(digest)
            if digest in targets:
                docs[digest] = data
            if progress:
                progress(len(have), count)
    manifests: dict[str, Any] = {}
    for ref in header["refs"]:
        data = docs.get(ref["digest"])
        if data is None:
            raise ArtifactFormatError(f"bundle {path} lacks the manifest of {ref['key'][:12]}")
        try:
            missing = set(required_parts(data)) - have
            named = manifest_key(data)
            manifests[ref["key"]] = _parsed(data, ref["key"])
        except InputLimitError as err:
            raise ArtifactFormatError(f"bundle {path} is refused: the manifest of {ref['key'][:12]} is over its "
                                      f"bounds ({err})") from err
        if missing:
            raise ArtifactFormatError(f"bundle {path} lacks {len(missing)} part(s) of artifact {ref['key'][:12]}")
        if named is not None and named != ref["key"]:
            raise ArtifactFormatError(f"bundle {path} maps key {ref['key'][:12]} to the manifest of {named[:12]}")
    return CheckedBundle(path, header, first, end, manifests)


def _parsed(data: bytes, key: str) -> Any:
    """A ref's manifest parsed, or None when it is not JSON (it has no signature: refused under verify keys, and a
    miss at load without them).

    Raises:
        InputLimitError: it is larger or deeper than a manifest may be.
    """
    try:
        return loads_json(data, MAX_MANIFEST_BYTES, f"manifest of {key[:12]}")
    except InputLimitError:
        raise
    except ValueError:
        return None


def check_trusted(bundle: CheckedBundle, cache: Cache) -> None:
    """Refuse a bundle holding an artifact that the verify keys configured here (or in ``cache``'s URL) refuse:
    importing its ref would replace a trusted entry with one every worker refuses.  Without verify keys, nothing.

    Raises:
        UntrustedArtifactError: an artifact of the bundle is unsigned, signed by another key, or changed since.
        TrustConfigError: a configured key cannot be read, or a key setting names no key.
    """
    from precompile.errors import UntrustedArtifactError
    from precompile.store.opening import open_with_policy

    cache, policy = open_with_policy(cache)
    for key, doc in bundle.manifests.items():
        verdict = policy.check(doc)
        if not verdict.ok:
            raise UntrustedArtifactError(f"bundle {bundle.path} is refused: artifact {key[:12]} in it is not trusted "
                                         f"here ({verdict.detail}); nothing was written (export it from a cache its "
                                         "builder signed, or import where no verify key is configured)",
                                         verdict.status, verdict.key_id)


def import_bundle(bundle: CheckedBundle, cache: Cache,
                  progress: Callable[[int, int], None] | None = None) -> tuple[list[Imported], int]:
    """Write the blobs, then the refs, of a bundle that passed :func:`check_bundle` into ``cache``.  Each blob is
    verified against its digest again as it is read back to be written.

    Args:
        progress: called ``(blobs written, blobs)`` after each blob.

    Returns:
        ``(one Imported per ref, blobs written)``.

    Raises:
        UntrustedArtifactError: verify keys are configured (here or in ``cache``'s URL) and a manifest of the
            bundle is not signed by one of them (nothing is written: such a ref would replace a trusted one with
            an entry every worker refuses).
        ArtifactFormatError: a blob no longer matches its digest (the file changed since it was checked).
        FileNotFoundError: the file is gone.
        CacheReadOnlyError / CacheUnavailableError: the cache refused a write.
        TrustConfigError: a configured key cannot be read, or a key setting names no key.
    """
    check_trusted(bundle, cache)
    path, header, count = bundle.path, bundle.header, bundle.header["blobs"]
    written = 0
    with open_regular(path, "bundle") as f:
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
