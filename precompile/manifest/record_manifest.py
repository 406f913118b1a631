"""A record's manifest: small signed JSON facts an integration keeps in the cache beside the artifacts
(docs/format.md, "Records").  Reading and writing records in a cache: :mod:`precompile.store.record`.

A record is stored like an artifact (``ref/<key>`` -> the record's manifest blob, signed the same way, with the
fields every cache tool reads generically: ``schema``, ``kind``, ``key``, ``factors``, ``blobs``,
``signature``), and named by ``"kind": "record"`` and a ``purpose``.  It holds data only: its reader validates
every field against what it expects before using it, and nothing in it is run, imported, unpickled or used as a
path.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from cache_backends.base import HEX64
from precompile import config
from precompile.manifest.manifest import ManifestJSON
from precompile.errors import ArtifactFormatError

#: The kind a record's manifest names itself by.
KIND = "record"
#: Largest ``data`` stored, bytes (compact JSON).
MAX_RECORD_BYTES = 64 << 10
#: Largest record manifest stored or read, bytes (its data, factors, build and signature, as stored).
MAX_MANIFEST_BYTES = 256 << 10
_PURPOSE = re.compile(r"^[a-z][a-z0-9_]{0,63}\Z")


def is_record_doc(doc: object) -> bool:
    """Whether a parsed manifest is a record's."""
    return isinstance(doc, dict) and doc.get("kind") == KIND


@dataclass
class RecordManifest(ManifestJSON):
    """A record; ``RecordManifest.from_dict(r.to_dict()) == r``.

    Attributes:
        key: sha256 hex of the canonical JSON of ``factors`` (:func:`precompile.key.plan.compute_key`).
        purpose: what the record is for, a lowercase identifier (e.g. ``"vllm_modelinfo"``).
        factors: what the key hashes; it holds ``purpose`` and ``kind`` too.
        data: the fact, a JSON object of at most :data:`MAX_RECORD_BYTES` bytes.
        blobs: ``{}``: a record has no parts (the field is there for the generic cache tools).
        build: facts about the write (created, precompile version); never in the key.
        signature: as an artifact manifest's (:mod:`precompile.manifest.trust`).
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
        cls._check_header(doc, "record")
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
