"""Whole-function artifacts in a cache: read verified before anything is unpickled, written blobs-then-ref.

Read and written through the one entry store (:mod:`precompile.store.entries`), as graph artifacts and records
are: the manifest's signature is checked first where
verify keys are configured (an unsigned or badly signed entry is a counted miss, nothing of it read further), then
its structure, every name and every length (:class:`~precompile.manifest.function_manifest.FunctionManifest`), then the
Dynamo part's digest.  Only then may :func:`precompile.inductor.dynamo.pkg.restore` unpickle it.  A damaged entry
is a miss and its ref is dropped; a cache failure is a miss, logged once and counted, never raised.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from cache_backends.base import MISS, Cache, digest_bytes
from precompile.manifest.function_manifest import FunctionManifest
from precompile.errors import CacheError
from precompile.store import entries

log = logging.getLogger("precompile")

#: Largest Dynamo part read, bytes (a real one is tens of kilobytes per traced frame).
MAX_DYNAMO_BYTES = 256 << 20
#: Largest piece map read, bytes (a vLLM model's: about 200 bytes per piece and compile range).
MAX_PIECES_BYTES = 4 << 20

#: Whole-function artifacts.
FUNCTION = entries.Kind("function artifact", "function artifact", FunctionManifest.from_dict)


@dataclass
class Stored:
    """A verified whole-function entry: its manifest and the Dynamo part's bytes (digest checked, not unpickled;
    empty for an entry stored as refused), and its piece map's bytes (digest checked, not parsed; empty where it
    has none)."""

    manifest: FunctionManifest
    dynamo: bytes
    digest: str = ""  # the manifest's digest (what the key's ref points at)
    pieces: bytes = b""


def drop(cache: Cache, key: str, why: str, digest: str | None = None) -> None:
    """Drop the ref of a damaged whole-function entry (:func:`precompile.store.entries.drop_ref`; with
    ``digest``, only if the ref still names that manifest)."""
    entries.drop_ref(cache, key, why, FUNCTION.what, digest=digest)


def read(cache: Cache, key: str) -> Stored | None:
    """The verified entry stored under ``key``, or None on a miss (see the module docstring), read through
    :func:`precompile.store.entries.read_entry`.

    Raises:
        TrustConfigError: a configured signing or verify key cannot be read.
    """
    from precompile.store.opening import open_with_policy

    cache, policy = open_with_policy(cache)

    def finish(entry: entries.Entry[FunctionManifest]) -> Stored:
        manifest = entry.manifest
        entries.check_key(manifest, key)
        if policy.no_host_code:  # Dynamo's part is a pickle and its bytecode runs: host code
            raise entries.HostCode("Dynamo's bytecode")
        if manifest.refused is not None:
            return Stored(manifest, b"", entry.digest)
        part = manifest.parts["dynamo"]
        size = int(manifest.blobs[part]["size"])
        if size > MAX_DYNAMO_BYTES:
            raise entries.Damaged(f"its Dynamo part claims {manifest.blobs[part]['size']} bytes (at most "
                                  f"{MAX_DYNAMO_BYTES})")
        data = cache.get_blob(part, size)  # no larger than the manifest says
        # the backend verified the digest; checked again here because the next step unpickles
        if data is MISS or len(data) > MAX_DYNAMO_BYTES or digest_bytes(data) != part:
            raise entries.Damaged("its Dynamo part is missing or corrupt")
        return Stored(manifest, bytes(data), entry.digest, _read_pieces(cache, manifest))

    return entries.read_entry(cache, key, FUNCTION, policy, finish)


def _read_pieces(cache: Cache, manifest: FunctionManifest) -> bytes:
    """The piece map's bytes (``parts.pieces``), digest checked; empty where the manifest names none.

    Raises:
        entries.Damaged: it is over :data:`MAX_PIECES_BYTES`, missing or corrupt (the entry is then a miss)."""
    part = manifest.parts.get("pieces")
    if part is None:
        return b""
    size = int(manifest.blobs[part]["size"])
    if size > MAX_PIECES_BYTES:
        raise entries.Damaged(f"its piece map claims {size} bytes (at most {MAX_PIECES_BYTES})")
    data = cache.get_blob(part, size)
    if data is MISS or len(data) > MAX_PIECES_BYTES or digest_bytes(data) != part:
        raise entries.Damaged("its piece map is missing or corrupt")
    return bytes(data)


def write(cache: Cache, manifest: FunctionManifest, dynamo: bytes, over: str | None = None,
          pieces: bytes = b"") -> str | None:
    """Store the Dynamo part (and the piece map, where ``manifest.parts`` names one), then the manifest (signed
    where a signing key is configured), then the ref (:func:`precompile.store.entries.write_entry`).

    Args:
        pieces: the piece map's bytes, the blob ``manifest.parts["pieces"]`` names (a vLLM entry's).
        over: after a retrace, the manifest digest this process loaded: the entry is rewritten only while the key
            still points at it (and, where the cache has leases, under the key's lease), so that of the workers a
            new size sends tracing at once, one rewrites the key and the others keep what it wrote.

    Returns:
        the stored manifest's digest, or None when nothing was written: the cache refused (read-only,
        unavailable, or verify keys set without a signing key: logged once, counted, never raised), or ``over``
        is no longer the stored entry.

    Raises:
        TrustConfigError: the configured signing key cannot be read.
    """
    held: list[str] = []

    def still_ours(signed: FunctionManifest) -> bool:
        if over is None:
            return True
        if cache.supports_leases:
            token = cache.acquire_lease(signed.key)
            if token is None:
                return False  # another worker is rewriting it
            held.append(token)
        if cache.get_ref(signed.key) != over:
            log.info("function artifact %s was stored again by another worker since it was loaded here; kept",
                     signed.key[:12])
            return False
        return True

    try:
        written = entries.write_entry(cache, manifest, FUNCTION, before=still_ours,
                                      parts=lambda signed: _parts(signed, dynamo, pieces))
    finally:
        for token in held:
            with contextlib.suppress(CacheError):
                cache.release_lease(manifest.key, token)
    return written[1] if written is not None else None


def _parts(signed: FunctionManifest, dynamo: bytes, pieces: bytes) -> dict[str, bytes]:
    out = {signed.parts["dynamo"]: dynamo}
    if "pieces" in signed.parts:
        out[signed.parts["pieces"]] = pieces
    return out


def write_refused(cache: Cache, key: str, factors: dict[str, Any], env: dict[str, Any], build: dict[str, Any]) -> None:
    """Store under ``key`` that the function cannot be stored whole, and why (``build["refused"]``): a manifest with no
    parts, signed like any other, so that the other workers of a fleet read the reason instead of each tracing,
    failing and rewriting the same key.  A cache that refuses the write is logged and counted, never raised."""
    manifest = FunctionManifest(key=key, factors=factors, parts={}, graphs={}, sources=[], frames=[], env=env,
                                blobs={}, build=build)
    entries.write_entry(cache, manifest, FUNCTION)
