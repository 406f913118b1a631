"""Whole-function artifacts in a cache: read verified before anything is unpickled, written blobs-then-ref.

The same policy as graph artifacts (:mod:`precompile.store.cache_io`): the manifest's signature is checked first where
verify keys are configured (an unsigned or badly signed entry is a counted miss, nothing of it read further), then
its structure, every name and every length (:class:`~precompile.artifact.function_manifest.FunctionManifest`), then the
Dynamo part's digest.  Only then may :func:`precompile.inductor.dynamo.pkg.restore` unpickle it.  A damaged entry
is a miss and its ref is dropped; a cache failure is a miss, logged once and counted, never raised.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from cache_backends.base import MISS, Cache, digest_bytes
from precompile import metrics
from precompile.artifact.function_manifest import FunctionManifest
from precompile.errors import ArtifactFormatError, CacheError, UnsafePathError
from precompile.metrics import safe_incr
from precompile.store import refusals
from precompile.store.cache_io import (
    drop_ref,
    read_failed,
    read_manifest_doc,
    refused_unsafe,
    signed_for_store,
    write_failed,
)

log = logging.getLogger("precompile")

#: Largest Dynamo part read, bytes (a real one is tens of kilobytes per traced frame).
MAX_DYNAMO_BYTES = 256 << 20


@dataclass
class Stored:
    """A verified whole-function entry: its manifest and the Dynamo part's bytes (digest checked, not unpickled;
    empty for an entry stored as refused)."""

    manifest: FunctionManifest
    dynamo: bytes
    digest: str = ""  # the manifest's digest (what the key's ref points at)


def drop(cache: Cache, key: str, why: str, digest: str | None = None) -> None:
    """Drop the ref of a damaged whole-function entry (:func:`precompile.store.cache_io.drop_ref`; with
    ``digest``, only if the ref still names that manifest)."""
    drop_ref(cache, key, why, "function artifact", digest=digest)


def read(cache: Cache, key: str) -> Stored | None:
    """The verified entry stored under ``key``, or None on a miss (see the module docstring).

    Raises:
        TrustConfigError: a configured signing or verify key cannot be read.
    """
    from precompile.store.opening import open_with_policy

    cache, policy = open_with_policy(cache)
    ctx = refusals.context(cache, policy)
    digest: str | None = None
    try:
        read = read_manifest_doc(cache, key, policy, "function artifact")
        if read is None:
            return None
        digest, doc = read
        manifest = FunctionManifest.from_dict(doc)
        if manifest.key != key:
            refusals.remember(key, digest, ctx, "its manifest names another key", "damaged")
            drop(cache, key, f"its manifest names another key {manifest.key[:12]}", digest)
            return None
        if policy.no_host_code:  # Dynamo's part is a pickle and its bytecode runs: host code
            refusals.remember(key, digest, ctx, "it carries host code", "host_code")
            log.info("function artifact %s carries host code (Dynamo's bytecode) and PRECOMPILE_REQUIRE_NO_HOST_CODE "
                     "is set: a miss", key[:12])
            safe_incr(cache, host_code_refused=1)
            metrics.note_miss("host_code")
            return None
        if manifest.refused is not None:
            return Stored(manifest, b"", digest)
        part = manifest.parts["dynamo"]
        if int(manifest.blobs[part]["size"]) > MAX_DYNAMO_BYTES:
            drop(cache, key,
                 f"its Dynamo part claims {manifest.blobs[part]['size']} bytes (at most {MAX_DYNAMO_BYTES})", digest)
            return None
        data = cache.get_blob(part, int(manifest.blobs[part]["size"]))  # no larger than the manifest says
        # the backend verified the digest; checked again here because the next step unpickles
        if data is MISS or len(data) > MAX_DYNAMO_BYTES or digest_bytes(data) != part:
            drop(cache, key, "its Dynamo part is missing or corrupt", digest)
            return None
    except UnsafePathError as err:
        refusals.remember(key, digest, ctx, str(err), "untrusted")
        refused_unsafe(cache, "function artifact", key, err)
        return None
    except ArtifactFormatError as err:
        refusals.remember(key, digest, ctx, str(err), "damaged")
        drop(cache, key, str(err), digest)
        return None
    except CacheError as err:
        read_failed(cache, "function artifact", key, err)
        return None
    return Stored(manifest, bytes(data), digest)


def write(cache: Cache, manifest: FunctionManifest, dynamo: bytes, over: str | None = None) -> str | None:
    """Store the Dynamo part, then the manifest (signed where a signing key is configured), then the ref.

    Args:
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
    signed = signed_for_store(cache, manifest, "function artifact")
    if signed is None:
        return None
    token = None
    try:
        if over is not None:
            if cache.supports_leases:
                token = cache.acquire_lease(signed.key)
                if token is None:
                    return None  # another worker is rewriting it
            if cache.get_ref(signed.key) != over:
                log.info("function artifact %s was stored again by another worker since it was loaded here; kept",
                         signed.key[:12])
                return None
        cache.put_blob(dynamo, signed.parts["dynamo"])
        digest = cache.put_blob(signed.to_json())
        cache.set_ref(signed.key, digest)
        return digest
    except CacheError as err:
        write_failed(cache, "function artifact", signed.key, err)
        return None
    finally:
        if token is not None:
            with contextlib.suppress(CacheError):
                cache.release_lease(signed.key, token)


def write_refused(cache: Cache, key: str, factors: dict[str, Any], env: dict[str, Any], build: dict[str, Any]) -> None:
    """Store under ``key`` that the function cannot be stored whole, and why (``build["refused"]``): a manifest with no
    parts, signed like any other, so that the other workers of a fleet read the reason instead of each tracing,
    failing and rewriting the same key.  A cache that refuses the write is logged and counted, never raised."""
    manifest = FunctionManifest(key=key, factors=factors, parts={}, graphs={}, sources=[], frames=[], env=env,
                                blobs={}, build=build)
    signed = signed_for_store(cache, manifest, "function artifact")
    if signed is None:
        return
    try:
        cache.set_ref(key, cache.put_blob(signed.to_json()))
    except CacheError as err:
        write_failed(cache, "function artifact", key, err)
