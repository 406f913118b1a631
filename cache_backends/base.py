"""The cache interface every backend implements.

A cache is a content-addressed store plus a reference table, as in Bazel's CAS/AC and the Hugging Face hub
cache (see DESIGN.md, "Cache layout"):

- blobs: immutable bytes named by the sha256 hex digest of their *uncompressed* content.  Every read is
  verified against the digest; a mismatch is dropped, counted under ``errors`` and reported as a miss.
- refs: a mutable name (an artifact key, 64 hex chars) pointing at a blob digest (the artifact's manifest).
- counters: named integers (hits, misses, builds, puts, bytes_read, bytes_written, errors, evictions) that
  outlive the process; ``stats()`` adds ``hit_rate``.

Misses are the :data:`MISS` sentinel, never ``None`` or an exception (dogpile's ``NO_VALUE``).

Every read is bounded (docs/format.md, "Bounds"): a caller that knows how large a blob may be says so
(``max_bytes``: the manifest cap for a manifest, the size the manifest records for a part), and a blob stored
larger than that, or decompressing past it, is a miss, counted under ``errors`` and ``over_limit``, logged, and left
in place (the bound may be another reader's) until this process stores the blob again, which rewrites it; nothing larger than :data:`~cache_backends.bounded.MAX_BLOB_BYTES`
is ever allocated for a blob.  A local file that is not a regular file (a FIFO, a device, a directory) is never
opened for reading in a way that blocks: it is a miss and is dropped.

Error policy, the same in every method of every backend: a backend raises :class:`CacheError` subclasses
(``CacheUnavailableError`` when storage cannot be reached, ``CacheReadOnlyError`` for a write to a read-only
cache); it never returns wrong bytes.  The artifact layer turns every ``CacheError`` into a miss or a skipped
write, logs it once and counts it: the user's call never fails because of the cache.
"""

from __future__ import annotations

import hashlib
import logging
import re
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Final, Union

from cache_backends.bounded import MAX_BLOB_BYTES, inflate
from cache_backends.redaction import redact_url

log = logging.getLogger("precompile.cache")

#: Names of the counters every backend keeps.
#: ``waits``: a miss served by waiting for another worker's build; ``takeovers``: a build started after another
#: worker's lease expired (a dead or stalled builder); ``loads_fast`` / ``loads_portable``: artifacts from this
#: cache whose callable was built by the fast path (carried binaries) or the portable path (Inductor's cache
#: entries, the slow fallback; the manifest's ``build.fast_off`` says why).
#: ``untrusted``: entries refused because verify keys are configured and the entry is not signed by one of them
#: (also counted under ``untrusted_<reason>``: ``unsigned``, ``unknown_key``, ``bad_signature``, ``malformed``).
COUNTERS: Final = ("hits", "misses", "builds", "puts", "bytes_read", "bytes_written", "errors", "evictions",
                   "waits", "takeovers", "loads_fast", "loads_portable", "untrusted")

#: A digest or an artifact key: 64 lowercase hex characters.
HEX64: Final = re.compile(r"\A[0-9a-f]{64}\Z")  # \Z, not $: "$" also matches before a final newline


#: What ``get_blob``/``get_blobs`` take as ``max_bytes``: one bound for every digest, a bound per digest (a
#: manifest's recorded sizes; a digest it lacks gets :data:`MAX_BLOB_BYTES`), or None for the format's bound.
Bounds = Union[int, Mapping[str, int], None]


def blob_bound(max_bytes: Bounds, digest: str) -> int:
    """The largest size in bytes (uncompressed) accepted for blob ``digest`` under ``max_bytes`` (see :data:`Bounds`):
    never more than :data:`~cache_backends.bounded.MAX_BLOB_BYTES`, never negative."""
    if max_bytes is None:
        return MAX_BLOB_BYTES
    bound = max_bytes.get(digest, MAX_BLOB_BYTES) if isinstance(max_bytes, Mapping) else max_bytes
    return max(0, min(int(bound), MAX_BLOB_BYTES))


def decompress_frame(raw: bytes, max_bytes: int = MAX_BLOB_BYTES) -> bytes:
    """Decompress one zstd frame written by a backend's ``put_blob`` (``zstandard.ZstdCompressor().compress``), to
    at most ``max_bytes`` bytes (:func:`cache_backends.bounded.inflate`).

    Raises:
        InputLimitError: (a ValueError) it decompresses, or its header says it does, to more than ``max_bytes``;
            checked before the output is allocated.  The stored copy is not damaged: callers do not drop it.
        ValueError: truncated or garbled data, or a header claiming an implausible size (checked before the
            output is allocated).
    """
    return inflate(raw, max_bytes)


class _Miss:
    """Type of :data:`MISS`; falsy, one instance."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "MISS"


#: Returned by ``get_blob``/``get_ref`` when nothing (valid) is stored under the name.
MISS: Final = _Miss()


def digest_bytes(data: bytes | bytearray | memoryview) -> str:
    """sha256 hex digest (64 lowercase hex chars) of ``data``: the name of a blob."""
    return hashlib.sha256(data).hexdigest()


def check_name(name: str, what: str = "digest") -> str:
    """Return ``name`` if it is 64 lowercase hex chars.

    Raises:
        ValueError: otherwise, naming ``what`` it was meant to be (a digest or an artifact key).
    """
    if not isinstance(name, str) or not HEX64.match(name):
        raise ValueError(f"a {what} must be 64 lowercase hex characters, got {name!r}")
    return name


def add_counts(pending: Counter[str], counts: dict[str, int]) -> None:
    """Add ``counts`` to ``pending`` (a backend's counts not yet persisted); a value that is not an integer is
    logged and ignored, never raised (counting never fails a call)."""
    for name, value in counts.items():
        try:
            if value:
                pending[str(name)] += int(value)
        except (TypeError, ValueError):
            log.warning("ignored counter %s=%r: not an integer", name, value)


def ordered_counters(values: Counter[str] | dict[str, int]) -> dict[str, int]:
    """Every counter of :data:`COUNTERS` (0 if absent) in that order, then any other name, sorted."""
    return {name: values.get(name, 0) for name in (*COUNTERS, *sorted(set(values) - set(COUNTERS)))}


def hit_rate(counters: dict[str, int]) -> float:
    """hits / (hits + misses), 0.0 when there was no lookup."""
    total = counters.get("hits", 0) + counters.get("misses", 0)
    return counters.get("hits", 0) / total if total else 0.0


@dataclass(frozen=True)
class StoredBlob:
    """A blob as stored, for upkeep (``precompile verify``/``gc``): its digest, its size as stored (compressed
    bytes, chunks included) and when it was last written (seconds since the epoch), or read where the backend
    tracks reads (Redis: now minus the key's idle time); None where unknown."""

    digest: str
    stored_bytes: int
    last_used: float | None


@dataclass(frozen=True)
class StoredRef:
    """A ref as stored: artifact key, the digest it names, and when it was last read or written (the LRU clock;
    seconds since the epoch, None where unknown).  ``digest`` is the stored text, which may be garbled."""

    key: str
    digest: str
    last_used: float | None


class Cache(ABC):
    """A blob store + ref table + counters.  Subclasses: ``LocalCache`` (``file://``), later Redis and tiered.

    Attributes:
        url: the cache's URL as shown in logs, errors, stats and metrics labels: whatever a backend sets is stored
            redacted (:func:`cache_backends.redaction.redact_url`: passwords, ``ssl_password``, secret-looking
            options masked as ``***``), so it reopens the cache only where the URL carried no secret.
        read_only: True when every write raises :class:`CacheReadOnlyError`.
    """

    @property
    def url(self) -> str:
        """The cache's URL, redacted (see the class's attributes)."""
        return self._shown_url

    @url.setter
    def url(self, value: str) -> None:
        self._shown_url = redact_url(value)

    read_only: bool = False

    # ----------------------------------------------------------------------------------------------- blobs
    @abstractmethod
    def get_blob(self, digest: str, max_bytes: int | None = None) -> bytes | _Miss:
        """Bytes of blob ``digest`` (uncompressed, verified), or :data:`MISS`.

        A stored copy whose content does not hash to ``digest`` (flipped byte, truncation) is deleted,
        counted under ``errors``, and reported as :data:`MISS`.  One that would be larger than ``max_bytes``
        bytes uncompressed (default and cap: :data:`~cache_backends.bounded.MAX_BLOB_BYTES`) is a miss counted
        under ``errors`` and ``over_limit``, refused before it is allocated, and kept until this process
        stores the blob again (then rewritten).

        Raises:
            CacheUnavailableError: the storage cannot be reached.
        """

    def get_blobs(self, digests: list[str], max_bytes: Bounds = None) -> dict[str, bytes | _Miss]:
        """``{digest: bytes or MISS}`` for each digest, each bounded as :meth:`get_blob` by
        :func:`blob_bound(max_bytes, digest) <blob_bound>`; backends may fetch in parallel or pipelined."""
        return {d: self.get_blob(d, blob_bound(max_bytes, d)) for d in digests}

    @abstractmethod
    def has_blob(self, digest: str) -> bool:
        """True if a blob is stored under ``digest`` (not verified; a cheap existence check)."""

    def has_blobs(self, digests: list[str]) -> dict[str, bool]:
        """``{digest: exists}`` for each digest (not verified); backends may batch the checks, and a backend with
        expiry refreshes what exists (a load keeps every part of the artifact alive, read or not)."""
        return {d: self.has_blob(d) for d in dict.fromkeys(digests)}

    @abstractmethod
    def put_blob(self, data: bytes, digest: str | None = None) -> str:
        """Store ``data`` (idempotent) and return its digest.

        ``digest``, if given, must be :func:`digest_bytes` of ``data``; it saves hashing twice.

        Raises:
            ValueError: ``digest`` is given and does not match ``data``.
            CacheReadOnlyError: the cache is read-only.
            CacheUnavailableError: the storage cannot be reached or is full.
        """

    def fetch_lock(self, digests: list[str]) -> AbstractContextManager[set[str]] | None:
        """An optional capability (None where the backend has none, the default): a context manager that holds, for
        the processes of this host, the right to fetch blobs ``digests`` from a farther tier into this cache, waiting
        a bounded time for another holder; entering it gives the digests another process was fetching.  A tiered
        cache takes it in its near tier, then reads the near tier again (see :mod:`cache_backends.local.fetch`)."""
        return None

    # ------------------------------------------------------------------------------------------------ refs
    @abstractmethod
    def get_ref(self, key: str) -> str | _Miss:
        """The digest stored under artifact key ``key``, or :data:`MISS`.  A hit refreshes its LRU time.

        Raises:
            CacheUnavailableError: the storage cannot be reached.
        """

    @abstractmethod
    def set_ref(self, key: str, digest: str) -> None:
        """Point ``key`` at ``digest``, atomically.  Callers write every blob the ref names first.

        Raises:
            CacheReadOnlyError: the cache is read-only.
            CacheUnavailableError: the storage cannot be reached.
        """

    @abstractmethod
    def delete_ref(self, key: str, digest: str | None = None) -> bool:
        """Remove ``key``; True if it existed.  With ``digest``, only if the ref still names that digest
        (compare-and-delete): a reader dropping the entry it found damaged never deletes one a writer stored since.

        Raises:
            CacheReadOnlyError: the cache is read-only.
        """

    @abstractmethod
    def iter_refs(self) -> Iterator[tuple[str, str]]:
        """Yield ``(key, digest)`` for every ref, in no particular order."""

    # --------------------------------------------------------------------------------------------- leases
    #: True if this backend can coordinate builds across processes (``acquire_lease`` and friends work).
    supports_leases: bool = False
    #: Seconds a worker waits for another worker's build of the same key before building itself.
    wait_s: float = 600.0
    #: Seconds a build lease lives unless renewed.
    lease_ttl_s: float = 30.0

    def acquire_lease(self, key: str, ttl_s: float | None = None) -> str | None:
        """Take the build lease of artifact ``key`` for ``ttl_s`` seconds: a random token, or None if another
        worker holds it.  Backends without leases (``supports_leases`` False) raise NotImplementedError."""
        raise NotImplementedError(f"{type(self).__name__} has no build leases")

    def renew_lease(self, key: str, token: str, ttl_s: float | None = None) -> bool:
        """Extend the lease ``token`` holds to ``ttl_s`` seconds from now; False if it was lost."""
        raise NotImplementedError(f"{type(self).__name__} has no build leases")

    def release_lease(self, key: str, token: str) -> bool:
        """Give the lease back if ``token`` still holds it (compare-and-delete); True if it did."""
        raise NotImplementedError(f"{type(self).__name__} has no build leases")

    def lease_held(self, key: str) -> bool:
        """True if some worker holds the build lease of ``key`` now."""
        raise NotImplementedError(f"{type(self).__name__} has no build leases")

    # ------------------------------------------------------------------------------------------- counters
    @abstractmethod
    def incr(self, **counts: int) -> None:
        """Add to named counters, e.g. ``incr(hits=1, bytes_read=123)``.  Never raises: a counter that
        cannot be persisted is kept in memory and the failure is logged once."""

    @abstractmethod
    def counters(self) -> dict[str, int]:
        """Current value of every counter in :data:`COUNTERS` (0 if never incremented)."""

    def stats(self) -> dict[str, object]:
        """Counters plus ``hit_rate`` (0..1), ``url``, ``backend`` and, where known, ``bytes_stored`` and
        ``max_bytes``.  JSON-ready."""
        c = self.counters()
        out: dict[str, object] = {"url": self.url, "backend": type(self).__name__, **c, "hit_rate": hit_rate(c)}
        return out

    # --------------------------------------------------------------------------- upkeep (verify, gc: optional)
    #: True if :meth:`list_blobs`, :meth:`list_refs`, :meth:`check_blob`, :meth:`drop_blob` and
    #: :meth:`drop_ref` work (a tiered cache has none: upkeep runs on each of its tiers).
    supports_upkeep: bool = False

    def list_blobs(self) -> list[StoredBlob]:
        """Every stored blob (not verified).

        Raises:
            CacheUnavailableError: the storage cannot be listed.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot list its blobs")

    def list_refs(self) -> list[StoredRef]:
        """Every stored ref, garbled ones included (their ``digest`` is not 64 hex characters).

        Raises:
            CacheUnavailableError: the storage cannot be listed.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot list its refs")

    def check_blob(self, digest: str) -> tuple[int | None, str | None]:
        """Read blob ``digest`` and re-hash it without dropping anything: ``(uncompressed bytes, None)`` when it
        is intact, ``(None, why)`` when it is missing or damaged.

        Raises:
            CacheUnavailableError: the storage cannot be read.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot check a blob")

    def drop_blob(self, blob: StoredBlob) -> bool:
        """Delete a listed blob, unless the backend sees that it was written again since it was listed (a
        writer is using it); True if deleted.

        Raises:
            CacheReadOnlyError: the cache is read-only.
            CacheUnavailableError: the storage cannot be reached.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot delete a blob")

    def drop_ref(self, ref: StoredRef) -> bool:
        """Delete a listed ref, unless it names another digest now (or, where the backend tracks it, was read
        since it was listed); True if deleted.

        Raises:
            CacheReadOnlyError: the cache is read-only.
            CacheUnavailableError: the storage cannot be reached.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot delete a ref")

    # --------------------------------------------------------------------------------------------- upkeep
    def close(self) -> None:
        """Release connections and file handles.  The cache must not be used afterwards."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
