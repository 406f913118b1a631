"""Artifact files: one binary file (``format="binary"``) or a directory a person can read (``"unpacked"``).

Binary layout (see docs/format.md)::

    magic      8 bytes   b"\\x89PCART\\r\\n"
    version    u32 LE    artifact format version (precompile.config.FORMAT_VERSION)
    manifest   u64 LE length + manifest JSON bytes
    count      u32 LE    number of blobs
    blob * count:  32-byte raw sha256 of the uncompressed bytes, u64 LE length, zstd frame of that length
    end        8 bytes   b"PCARTEND"

The unpacked directory holds ``manifest.json``, ``index.json`` (digest -> file) and each part as a file a person
opens directly: ``graph/code.py``, ``graph/graph.json``, ``inputs.json``, ``wrappers/*.py``,
``kernels/*.cpp|*.py``, ``binaries/<kernel>/*``, ``autotune.json``, ``alignment.json``, ``env.json``,
``engine/payload.bin``.  Every part is checked against its digest when read.

Every file is opened without blocking and only if it is a regular file (a FIFO, a device or a directory is a
:class:`~precompile.errors.NotRegularFileError`, nothing read).  Every length and count read from a file is bounded
by the bytes the file holds, the manifest by :data:`~cache_backends.bounded.MAX_MANIFEST_BYTES`, every blob by the
size its manifest records (checked before it is read or decompressed), and every name that becomes a path, on save
and on load, is checked (:mod:`precompile.manifest.names`): garbage is an :class:`ArtifactFormatError`, never a
huge allocation, a hang, or a file written or read outside the artifact's directory.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import IO

from cache_backends.base import decompress_frame, digest_bytes
from cache_backends.bounded import (
    MAX_BLOB_BYTES,
    MAX_MANIFEST_BYTES,
    frame_bound,
    open_regular,
    read_exact,
    read_regular,
)
from precompile import config
from precompile.manifest import names
from precompile.manifest.manifest import Manifest, load_json
from precompile.manifest.output import replacing
from precompile.errors import ArtifactFormatError, InputLimitError, NotRegularFileError, PrecompileError

MAGIC = b"\x89PCART\r\n"
END = b"PCARTEND"
#: Bytes of one blob entry besides its frame: raw sha256 and u64 length.
_ENTRY = 32 + 8


def write_binary(path: Path, manifest: bytes, blobs: dict[str, bytes]) -> None:
    import zstandard

    comp = zstandard.ZstdCompressor(level=3)
    with replacing(path, "artifact") as f:  # a regular file or a new one, never a device (OutputPathError)
        f.write(MAGIC)
        f.write(struct.pack("<I", config.FORMAT_VERSION))
        f.write(struct.pack("<Q", len(manifest)))
        f.write(manifest)
        f.write(struct.pack("<I", len(blobs)))
        for digest, data in blobs.items():
            z = comp.compress(data)
            f.write(bytes.fromhex(digest))
            f.write(struct.pack("<Q", len(z)))
            f.write(z)
        f.write(END)


def read_binary(path: Path, check: Callable[[Manifest], None] | None = None) -> tuple[Manifest, dict[str, bytes]]:
    """The manifest and every blob of the artifact file ``path``, each checked against its digest and bounded.

    The file is opened without blocking and only if it is a regular file, and read as a stream: every length is
    checked against the bytes the file holds before it is read, the manifest against
    :data:`~cache_backends.bounded.MAX_MANIFEST_BYTES`, each blob's frame against the size its manifest records
    (before it is read or decompressed); a blob the manifest does not name is skipped unread.

    Args:
        check: called with the parsed manifest before any blob is read (the loader checks its signature here,
            so an untrusted file's blobs are never read); its exceptions propagate.

    Raises:
        NotRegularFileError: ``path`` is a FIFO, device, directory or socket (nothing is read from it).
        ArtifactFormatError: not an artifact file, another version, truncated, or a blob that does not match its
            manifest; a size over its bound is one too, chained to the :class:`~precompile.errors.InputLimitError`.
        UnsafePathError: a name in the manifest would be an unsafe path or import.
        OSError: the file cannot be opened (a read that fails is an ``ArtifactFormatError``).
    """
    with open_regular(path, "artifact file") as f:
        try:
            return _read_binary(f, os.fstat(f.fileno()).st_size, path, check)
        except PrecompileError:  # UntrustedArtifactError (from check) is a PermissionError, an OSError too
            raise
        except OSError as err:  # a "regular" file that fails its reads (/proc/self/mem: EIO)
            raise ArtifactFormatError(f"{path} cannot be read: {err}") from err


def _read_binary(f: IO[bytes], size: int, path: Path,
                 check: Callable[[Manifest], None] | None) -> tuple[Manifest, dict[str, bytes]]:
    pos = 0

    def take(n: int, what: str, bound: int | None = None) -> bytes:
        nonlocal pos
        if pos + n > size:
            raise ArtifactFormatError(f"{path} is truncated: {what} needs {n} bytes at offset {pos}, the file has "
                                      f"{size} bytes in all; copy the artifact again")
        if bound is not None and n > bound:
            limit = InputLimitError(f"{what} claims {n} bytes, more than the {bound} accepted")
            raise ArtifactFormatError(f"{path}: {limit}; refused before reading it") from limit
        out = read_exact(f, n)
        if len(out) != n:
            raise ArtifactFormatError(f"{path} is truncated: {what} ended after {len(out)} of {n} bytes (the file "
                                      "shrank while it was read); copy the artifact again")
        pos += n
        return out

    head = f.read(len(MAGIC))
    if len(head) < len(MAGIC) and MAGIC.startswith(head):
        raise ArtifactFormatError(f"{path} is truncated: it has {len(head)} bytes, fewer than the artifact's "
                                  f"{len(MAGIC)}-byte header (an empty or cut-off copy); copy the artifact again")
    if head != MAGIC:
        raise ArtifactFormatError(f"{path} is not a precompile artifact (it does not start with the artifact "
                                  "magic bytes); expected a file written by Artifact.save(format='binary')")
    pos = len(MAGIC)
    (version,) = struct.unpack("<I", take(4, "the format version"))
    if version != config.FORMAT_VERSION:
        raise ArtifactFormatError(f"{path} has artifact format version {version}; this precompile reads "
                                  f"version {config.FORMAT_VERSION}")
    (mlen,) = struct.unpack("<Q", take(8, "the manifest length"))
    manifest = Manifest.from_json(take(mlen, "the manifest", MAX_MANIFEST_BYTES))
    if check is not None:
        check(manifest)
    (count,) = struct.unpack("<I", take(4, "the blob count"))
    if count * _ENTRY > size - pos:
        raise ArtifactFormatError(f"{path} is truncated or corrupt: it claims {count} blobs, which need at least "
                                  f"{count * _ENTRY} bytes, and {size - pos} are left; copy the artifact again")
    blobs: dict[str, bytes] = {}
    for i in range(count):
        digest = take(32, f"blob {i}'s digest").hex()
        (zlen,) = struct.unpack("<Q", take(8, f"blob {i}'s length"))
        info = manifest.blobs.get(digest)
        if info is None or digest in blobs:  # not part of this artifact (or again): never read, never kept
            if pos + zlen > size:
                take(zlen, f"blob {digest[:12]}")  # raises: truncated
            f.seek(zlen, os.SEEK_CUR)
            pos += zlen
            continue
        recorded = min(int(info["size"]), MAX_BLOB_BYTES)
        frame = take(zlen, f"blob {digest[:12]}", frame_bound(recorded))
        try:
            raw = decompress_frame(frame, recorded)
        except InputLimitError as err:
            raise ArtifactFormatError(f"{path}: blob {digest[:12]} does not match its manifest, which records "
                                      f"{info['size']} bytes ({err})") from err
        except ValueError as err:
            raise ArtifactFormatError(f"{path}: blob {digest[:12]} does not decompress ({err})") from err
        if len(raw) != info["size"] or digest_bytes(raw) != digest:
            raise ArtifactFormatError(f"{path}: blob {digest[:12]} does not match its digest (the file is corrupt)")
        blobs[digest] = raw
    if take(len(END), "the end marker") != END:
        raise ArtifactFormatError(f"{path} is corrupt: the end marker is missing")
    _check_complete(path, manifest, blobs)
    return manifest, blobs


def _check_complete(path: Path, manifest: Manifest, blobs: dict[str, bytes]) -> None:
    missing = [d for d in manifest.blobs if d not in blobs]
    if missing:
        raise ArtifactFormatError(f"{path} lacks {len(missing)} part(s) its manifest names "
                                  f"(e.g. {manifest.blobs[missing[0]].get('role')})")


def _unpacked_layout(manifest: Manifest) -> dict[str, str]:
    """``{digest: relative file path}`` for the unpacked directory.

    Raises:
        UnsafePathError: a kernel, wrapper or binary name is not a plain name (relative path for binaries).
    """
    paths: dict[str, str] = {}
    parts = manifest.parts
    paths[parts["fx_graph"]["code"]] = "graph/code.py"
    paths[parts["fx_graph"]["graph"]] = "graph/graph.json"
    paths[parts["engine_payload"]] = "engine/payload.bin"
    if parts.get("inductor_config"):
        paths[parts["inductor_config"]] = "inductor_config.json"
    for name, d in parts.get("wrappers", {}).items():
        paths.setdefault(d, f"wrappers/{names.plain_name(name, 'parts.wrappers')}.py")
    if parts.get("fast") and "source" in parts["fast"]:
        wrapper = names.plain_name(parts["fast"]["wrapper"], "parts.fast.wrapper")
        paths.setdefault(parts["fast"]["source"], f"wrappers/{wrapper}.fast.py")
    for i, k in enumerate(manifest.kernels):
        ext = "cpp" if k["lang"] == "cpp" else "py"
        kname = names.kernel_name(k["name"], f"kernels[{i}].name")
        paths.setdefault(k["source"], f"kernels/{names.file_name(kname, '.' + ext)}")
        for fname, d in k["binaries"].items():
            rel = names.binary_name(fname, f"kernels[{i}].binaries").split("/")
            rel = "/".join(names.file_name(part) for part in rel)
            paths.setdefault(d, f"binaries/{names.file_name(kname)}/{rel}")
    for d, info in manifest.blobs.items():
        paths.setdefault(d, f"blobs/{names.plain_name(d, 'blobs')}")
    return paths


def write_unpacked(path: Path, manifest: Manifest, raw_manifest: bytes, blobs: dict[str, bytes]) -> None:
    """Write the unpacked directory ``path`` (a temporary sibling, renamed into place).

    Raises:
        UnsafePathError: a name in the manifest would be written outside ``path`` (nothing is left behind).
        OSError: the file system refused the write.
    """
    import shutil
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        layout = _unpacked_layout(manifest)
        for digest, rel in layout.items():
            target = names.inside(tmp, rel, "unpacked layout")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(blobs[digest])
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    extras = {
        "inputs.json": manifest.placeholders,
        "autotune.json": manifest.autotune,
        "alignment.json": manifest.alignment,
        "env.json": manifest.env,
        "index.json": layout,
    }
    for name, value in extras.items():
        (tmp / name).write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")
    (tmp / "manifest.json").write_bytes(raw_manifest)
    if path.exists():
        old = path.with_name(f".{path.name}.old.{os.getpid()}")
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)


def read_unpacked(path: Path, check: Callable[[Manifest], None] | None = None) -> tuple[Manifest, dict[str, bytes]]:
    """The manifest and every blob of the unpacked directory ``path``, each checked against its digest.

    Every file is opened without blocking and only if it is a regular file (:mod:`cache_backends.bounded`), and
    refused unread when it is larger than its bound: ``manifest.json`` and ``index.json``
    :data:`~cache_backends.bounded.MAX_MANIFEST_BYTES` (and the JSON depth bound), each part the size its manifest
    records.

    Args:
        check: called with the parsed manifest before ``index.json`` or any part is read (the loader checks its
            signature here); its exceptions propagate.

    Raises:
        ArtifactFormatError: no ``manifest.json`` or one that cannot be read, a bad ``index.json``, a part missing, modified or larger than its
            manifest records (then chained to the :class:`~precompile.errors.InputLimitError`).
        NotRegularFileError: ``manifest.json``, ``index.json`` or a part is a FIFO, device, directory or socket
            (nothing is read from it).
        UnsafePathError: an ``index.json`` entry is not a plain relative path, or leads outside ``path`` (through
            ``..`` or a symbolic link).
    """
    try:
        raw = read_regular(path / "manifest.json", MAX_MANIFEST_BYTES, "manifest")
    except FileNotFoundError as err:
        raise ArtifactFormatError(f"{path} is a directory without manifest.json: not an unpacked precompile "
                                  "artifact") from err
    except InputLimitError as err:
        raise ArtifactFormatError(f"{path}/manifest.json is over its bound: {err}") from err
    except NotRegularFileError:
        raise
    except OSError as err:  # EIO, EACCES...: as read_binary words a file it cannot read
        raise ArtifactFormatError(f"{path}/manifest.json cannot be read: {err}") from err
    manifest = Manifest.from_dict(load_json(raw))
    if check is not None:
        check(manifest)
    try:
        layout = load_json(read_regular(path / "index.json", MAX_MANIFEST_BYTES, "index"))
    except NotRegularFileError:
        raise
    except (OSError, ArtifactFormatError, InputLimitError) as err:
        raise ArtifactFormatError(f"{path}/index.json is missing or invalid: {err}") from err
    if not isinstance(layout, dict):
        raise ArtifactFormatError(f"{path}/index.json is not a JSON object")
    blobs: dict[str, bytes] = {}
    for digest, info in manifest.blobs.items():
        rel = layout.get(digest)
        if rel is None:
            raise ArtifactFormatError(f"{path}/index.json does not list part {digest[:12]}")
        target = names.inside(path, rel, f"index.json[{digest[:12]}]")
        try:
            data = read_regular(target, min(int(info["size"]), MAX_BLOB_BYTES), f"part {digest[:12]}")
        except NotRegularFileError:
            raise
        except InputLimitError as err:
            raise ArtifactFormatError(f"{path}/{rel} was modified: it holds more than the {info['size']} bytes its "
                                      f"manifest records ({err})") from err
        except OSError as err:
            raise ArtifactFormatError(f"{path}/{rel} is missing: {err}") from err
        if digest_bytes(data) != digest:
            raise ArtifactFormatError(f"{path}/{rel} was modified: its sha256 does not match the manifest")
        blobs[digest] = data
    return manifest, blobs
