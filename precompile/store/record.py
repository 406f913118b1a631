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
import logging
from typing import Any

from cache_backends.base import Cache
from precompile import metrics
from precompile.artifact.record_manifest import (
    KIND,
    MAX_MANIFEST_BYTES,
    MAX_RECORD_BYTES,
    RecordManifest,
    is_record_doc,
)
from precompile.errors import ArtifactFormatError, CacheError

__all__ = ["KIND", "MAX_MANIFEST_BYTES", "MAX_RECORD_BYTES", "RecordManifest", "is_record_doc", "read", "record_key",
           "write"]

log = logging.getLogger("precompile")


def record_key(factors: dict[str, Any]) -> str:
    """The key of a record with these factors (which must hold ``kind`` and ``purpose``)."""
    from precompile.key.plan import compute_key

    return compute_key(factors)


def read(cache: Cache, key: str, purpose: str) -> RecordManifest | None:
    """The verified record stored under ``key`` for ``purpose``, or None on a miss (module docstring).

    Raises:
        TrustConfigError: a configured verify key cannot be read.
    """
    from precompile.artifact import trust
    from precompile.metrics import safe_incr, warn_once
    from precompile.store.cache_io import drop_ref, read_manifest_doc

    policy = trust.policy(cache)
    try:
        doc = read_manifest_doc(cache, key, policy, "record", max_bytes=MAX_MANIFEST_BYTES)
        if doc is None:
            return None
        record = RecordManifest.from_dict(doc)
        try:
            rekeyed = record_key(record.factors)
        except (TypeError, ValueError) as err:
            raise ArtifactFormatError(f"record factors cannot be encoded: {err}") from err
        if record.key != key or record.purpose != purpose or rekeyed != key:
            drop_ref(cache, key, "its manifest names another key or purpose", "record")
            return None
    except ArtifactFormatError as err:
        drop_ref(cache, key, str(err), "record")
        return None
    except CacheError as err:
        warn_once(cache, f"cache {cache.url} failed while reading record {key[:12]}: {err}; treating it as a miss",
                  kind=f"read {type(err).__name__}")
        safe_incr(cache, errors=1)
        metrics.note_miss("cache_error")
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
    from precompile.artifact import trust
    from precompile.metrics import safe_incr, warn_once

    if len(json.dumps(record.data, allow_nan=False)) > MAX_RECORD_BYTES:
        raise ValueError(f"record data is over {MAX_RECORD_BYTES} bytes")
    policy = trust.policy(cache)
    record = policy.sign(record)  # type: ignore[arg-type]
    if policy.required and record.signature is None:
        warn_once(cache, f"not storing record {record.key[:12]} in {cache.url}: verify keys are configured and no "
                         "signing key (PRECOMPILE_SIGNING_KEY)", kind="store unsigned")
        return None
    raw = record.to_json()
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ValueError(f"the record's manifest is {len(raw)} bytes, over {MAX_MANIFEST_BYTES}")
    try:
        cache.set_ref(record.key, cache.put_blob(raw))
        return record
    except CacheError as err:
        warn_once(cache, f"could not store record {record.key[:12]} in {cache.url}: {err}",
                  kind=f"store {type(err).__name__}")
        safe_incr(cache, errors=1)
        return None

