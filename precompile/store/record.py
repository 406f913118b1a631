"""Records in a cache: small signed JSON facts an integration keeps beside the artifacts (docs/format.md).

A start pays for more than compiling.  vLLM, for one, inspects the model's class in a subprocess (~8 s on a 2-core CPU)
before it builds anything, and keeps the answer on the machine's disk only.  A record carries such a fact through
the fleet's cache; its manifest (:class:`~precompile.artifact.record_manifest.RecordManifest`, re-exported here)
holds data only, and nothing in it is run, imported, unpickled or used as a path.

:func:`read` and :func:`write` follow the policy of graph and function artifacts: the signature is checked first
where verify keys are configured (an unsigned or badly signed record is a counted miss), then the structure and
every length; a damaged record is a miss and its ref is dropped; a cache failure is a miss, logged once and
counted, never raised.
"""

from __future__ import annotations

import json
from typing import Any

from cache_backends.base import Cache
from precompile.artifact.record_manifest import (
    KIND,
    MAX_MANIFEST_BYTES,
    MAX_RECORD_BYTES,
    RecordManifest,
    is_record_doc,
)
from precompile.errors import ArtifactFormatError, CacheError
from precompile.store import refusals
from precompile.store.cache_io import drop_ref, read_failed, read_manifest_doc, signed_for_store, write_failed

__all__ = ["KIND", "MAX_MANIFEST_BYTES", "MAX_RECORD_BYTES", "RecordManifest", "is_record_doc", "read", "record_key",
           "write"]


def record_key(factors: dict[str, Any]) -> str:
    """The key of a record with these factors (which must hold ``kind`` and ``purpose``)."""
    from precompile.key.plan import compute_key

    return compute_key(factors)


def read(cache: Cache, key: str, purpose: str) -> RecordManifest | None:
    """The verified record stored under ``key`` for ``purpose``, or None on a miss (module docstring).

    Raises:
        TrustConfigError: a configured verify key cannot be read.
    """
    from precompile.store.opening import open_with_policy

    cache, policy = open_with_policy(cache)
    digest: str | None = None
    try:
        read = read_manifest_doc(cache, key, policy, "record", max_bytes=MAX_MANIFEST_BYTES)
        if read is None:
            return None
        digest, doc = read
        record = RecordManifest.from_dict(doc)
        try:
            rekeyed = record_key(record.factors)
        except (TypeError, ValueError) as err:
            raise ArtifactFormatError(f"record factors cannot be encoded: {err}") from err
        if record.key != key or record.purpose != purpose or rekeyed != key:
            drop_ref(cache, key, "its manifest names another key or purpose", "record", digest=digest)
            return None
    except ArtifactFormatError as err:
        refusals.remember(key, digest, refusals.context(cache, policy), str(err), "damaged")
        drop_ref(cache, key, str(err), "record", digest=digest)
        return None
    except CacheError as err:
        read_failed(cache, "record", key, err)
        return None
    return record


def write(cache: Cache, record: RecordManifest) -> RecordManifest | None:
    """Store ``record`` (signed where a signing key is configured), manifest blob then ref.

    Returns:
        the stored record, or None when the cache refused: read-only, unavailable, or verify keys set without a
        signing key (logged once, counted, never raised).

    Raises:
        TrustConfigError: the configured signing key cannot be read.
        ValueError: ``record.data`` is over :data:`MAX_RECORD_BYTES`, the stored manifest would be over
            :data:`MAX_MANIFEST_BYTES` (what :func:`read` reads), or a value JSON cannot carry.
    """
    if len(json.dumps(record.data, allow_nan=False)) > MAX_RECORD_BYTES:
        raise ValueError(f"record data is over {MAX_RECORD_BYTES} bytes")
    signed = signed_for_store(cache, record, "record")
    if signed is None:
        return None
    raw = signed.to_json()
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ValueError(f"the record's manifest is {len(raw)} bytes, over {MAX_MANIFEST_BYTES}")
    try:
        cache.set_ref(signed.key, cache.put_blob(raw))
        return signed
    except CacheError as err:
        write_failed(cache, "record", signed.key, err)
        return None

