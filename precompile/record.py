"""Records: small signed JSON facts an integration keeps in the cache beside the artifacts (docs/format.md).

A start pays for more than compiling.  vLLM, for one, inspects the model's class in a subprocess (~8 s on a 2-core CPU)
before it builds anything, and keeps the answer on the machine's disk only.  A record carries such a fact through
the fleet's cache: a JSON object, stored like an artifact (``ref/<key>`` -> the record's manifest blob, signed the
same way, with the fields every cache tool reads generically: ``schema``, ``kind``, ``key``, ``factors``,
``blobs``, ``signature``), and named by ``"kind": "record"`` and a ``purpose``.  A record holds data only: its
reader validates every field against what it expects before using it, and nothing in it is run, imported,
unpickled or used as a path.

:func:`read` and :func:`write` follow the policy of graph and function artifacts: the signature is checked first
where verify keys are configured (an unsigned or badly signed record is a counted miss), then the structure and
every length; a damaged record is a miss and its ref is dropped; a cache failure is a miss, logged once and
counted, never raised.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from cache_backends.base import HEX64, Cache
from precompile import config, metrics
from precompile.errors import ArtifactFormatError, CacheError
from precompile.manifest import ManifestJSON

log = logging.getLogger("precompile")

#: The kind a record's manifest names itself by.
KIND = "record"
#: Largest ``data`` stored, bytes (compact JSON).
MAX_RECORD_BYTES = 64 << 10
#: Largest record manifest stored or read, bytes (its data, factors, build and signature, as stored).
MAX_MANIFEST_BYTES = 256 << 10
_PURPOSE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def is_record_doc(doc: object) -> bool:
    """Whether a parsed manifest is a record's."""
    return isinstance(doc, dict) and doc.get("kind") == KIND


@dataclass
class RecordManifest(ManifestJSON):
    """A record; ``RecordManifest.from_dict(r.to_dict()) == r``.

    Attributes:
        key: sha256 hex of the canonical JSON of ``factors`` (:func:`precompile.plan.compute_key`).
        purpose: what the record is for, a lowercase identifier (e.g. ``"vllm_modelinfo"``).
        factors: what the key hashes; it holds ``purpose`` and ``kind`` too.
        data: the fact, a JSON object of at most :data:`MAX_RECORD_BYTES` bytes.
        blobs: ``{}``: a record has no parts (the field is there for the generic cache tools).
        build: facts about the write (created, precompile version); never in the key.
        signature: as an artifact manifest's (:mod:`precompile.trust`).
    """

    key: str
    purpose: str
    factors: dict[str, Any]
    data: dict[str, Any]
    build: dict[str, Any] = field(default_factory=dict)
    blobs: dict[str, Any] = field(default_factory=dict)
    schema: int = config.FORMAT_VERSION
    kind: str = KIND
    signature: dict[str, Any] | None = None

    _FIELDS = ("schema", "kind", "key", "purpose", "factors", "data", "blobs", "build")

    @classmethod
    def from_dict(cls, doc: object) -> RecordManifest:
        """Build from a parsed dict, checking its structure and lengths.

        Raises:
            ArtifactFormatError: not a record of this schema; a field missing or mistyped; a purpose that is not a
                lowercase identifier or differs from the one in ``factors``; ``blobs`` not empty; ``data`` larger
                than :data:`MAX_RECORD_BYTES`.
        """
        if not is_record_doc(doc):
            raise ArtifactFormatError("not a record (no \"kind\": \"record\")")
        assert isinstance(doc, dict)
        if doc.get("schema") != config.FORMAT_VERSION:
            raise ArtifactFormatError(f"record schema {doc.get('schema')!r} is not supported by this precompile "
                                      f"(it reads schema {config.FORMAT_VERSION})")
        missing = [f for f in cls._FIELDS if f not in doc]
        if missing:
            raise ArtifactFormatError(f"record is missing fields {missing}")
        key, purpose = doc["key"], doc["purpose"]
        if not isinstance(key, str) or not HEX64.match(key):
            raise ArtifactFormatError(f"record field key is not a sha256 digest: {str(key)[:80]!r}")
        if not isinstance(purpose, str) or not _PURPOSE.match(purpose):
            raise ArtifactFormatError(f"record field purpose {str(purpose)[:80]!r} is not a lowercase identifier")
        for name in ("factors", "data", "blobs", "build"):
            if not isinstance(doc[name], dict):
                raise ArtifactFormatError(f"record field {name} is not an object ({type(doc[name]).__name__})")
        if doc["factors"].get("purpose") != purpose or doc["factors"].get("kind") != KIND:
            raise ArtifactFormatError("record factors do not name its kind and purpose")
        if doc["blobs"]:
            raise ArtifactFormatError("a record has no parts, and this one lists blobs")
        try:
            size = len(json.dumps(doc["data"], allow_nan=False))
        except ValueError as err:  # NaN or infinity, which json.loads accepts
            raise ArtifactFormatError(f"record data holds a value JSON cannot carry: {err}") from err
        if size > MAX_RECORD_BYTES:
            raise ArtifactFormatError(f"record data is over {MAX_RECORD_BYTES} bytes")
        return cls(**{f: doc[f] for f in cls._FIELDS}, signature=doc.get("signature"))


def record_key(factors: dict[str, Any]) -> str:
    """The key of a record with these factors (which must hold ``kind`` and ``purpose``)."""
    from precompile.plan import compute_key

    return compute_key(factors)


def read(cache: Cache, key: str, purpose: str) -> RecordManifest | None:
    """The verified record stored under ``key`` for ``purpose``, or None on a miss (module docstring).

    Raises:
        TrustConfigError: a configured verify key cannot be read.
    """
    from precompile import trust
    from precompile.cache_io import drop_ref, read_manifest_doc, safe_incr, warn_once

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
    from precompile import trust
    from precompile.cache_io import safe_incr, warn_once

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

