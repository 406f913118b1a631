"""Records in a cache: small signed JSON facts an integration keeps beside the artifacts (docs/format.md).

A start pays for more than compiling.  vLLM, for one, inspects the model's class in a subprocess (~8 s on a 2-core CPU)
before it builds anything, and keeps the answer on the machine's disk only.  A record carries such a fact through
the fleet's cache; its manifest (:class:`~precompile.manifest.record_manifest.RecordManifest`, re-exported here)
holds data only, and nothing in it is run, imported, unpickled or used as a path.

:func:`read` and :func:`write` go through the one entry store (:mod:`precompile.store.entries`), as graph and
function artifacts do: the signature is checked first where verify keys are configured (an unsigned or badly signed
record is a counted miss), then the structure and every length; a damaged record is a miss and its ref is dropped;
a cache failure is a miss, logged once and counted, never raised.
"""

from __future__ import annotations

import json
from typing import Any

from cache_backends.base import Cache
from precompile.manifest.record_manifest import (
    KIND,
    MAX_MANIFEST_BYTES,
    MAX_RECORD_BYTES,
    RecordManifest,
    is_record_doc,
)
from precompile.errors import ArtifactFormatError
from precompile.store import entries

__all__ = ["KIND", "MAX_MANIFEST_BYTES", "MAX_RECORD_BYTES", "RecordManifest", "is_record_doc", "read", "record_key",
           "write"]


def record_key(factors: dict[str, Any]) -> str:
    """The key of a record with these factors (which must hold ``kind`` and ``purpose``)."""
    from precompile.key.plan import compute_key

    return compute_key(factors)


#: Records: a small manifest, bounded by its own cap.
RECORD = entries.Kind("record", "record", RecordManifest.from_dict, max_bytes=MAX_MANIFEST_BYTES)


def read(cache: Cache, key: str, purpose: str) -> RecordManifest | None:
    """The verified record stored under ``key`` for ``purpose``, or None on a miss (module docstring), read through
    :func:`precompile.store.entries.read_entry`.  A record of another purpose under ``key`` is dropped, not
    remembered (the same bytes may be stored again for the right purpose).

    Raises:
        TrustConfigError: a configured verify key cannot be read.
    """
    from precompile.store.opening import open_with_policy

    cache, policy = open_with_policy(cache)

    def finish(entry: entries.Entry[RecordManifest]) -> RecordManifest:
        record = entry.manifest
        try:
            rekeyed = record_key(record.factors)
        except (TypeError, ValueError) as err:
            raise ArtifactFormatError(f"record factors cannot be encoded: {err}") from err
        if record.key != key or record.purpose != purpose or rekeyed != key:
            raise entries.Damaged("its manifest names another key or purpose")
        return record

    return entries.read_entry(cache, key, RECORD, policy, finish)


def write(cache: Cache, record: RecordManifest) -> RecordManifest | None:
    """Store ``record`` (signed where a signing key is configured), manifest blob then ref
    (:func:`precompile.store.entries.write_entry`).

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
    written = entries.write_entry(cache, record, RECORD, max_bytes=MAX_MANIFEST_BYTES)
    return written[0] if written is not None else None
