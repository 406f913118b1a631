"""``file://DIR``: a cache in a local (or shared) directory, safe for many processes at once.

Layout under the root directory (see DESIGN.md, "Cache layout")::

    blob/<2 hex>/<62 hex>   zstd-compressed bytes, named by the sha256 of the *uncompressed* bytes
    ref/<artifact key>      a small text file holding one digest (the artifact's manifest); its mtime is the LRU clock
    stats.json              persisted counters (see :data:`cache_backends.base.COUNTERS`)
    locks/                  ``filelock`` lock files (stats.lock, evict.lock; fetch/: one download per host,
                            :mod:`cache_backends.local.fetch`; lease/: one build per key,
                            :mod:`cache_backends.local.leases`)
    tmp/                    files being removed (moved here first, checked, then unlinked)

Every write goes to ``<name>.<uuid4 hex>.incomplete`` beside its target, is flushed and fsynced, then moved into
place with :func:`os.replace`, so a reader sees a whole file or none, and a crash never leaves a partial file under
a final name.  Every read is verified against its digest.  The locks only serialize counters, eviction, fetches
and builds; cache correctness does not depend on them (as in the Hugging Face hub cache).

>>> import tempfile
>>> tmp = tempfile.TemporaryDirectory()
>>> cache = LocalCache(tmp.name)
>>> digest = cache.put_blob(b"kernel source")
>>> cache.get_blob(digest)
b'kernel source'
>>> cache.get_ref("0" * 64)
MISS
>>> tmp.cleanup()
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

import zstandard

from cache_backends.base import (
    HEX64,
    MISS,
    Bounds,
    Cache,
    _Miss,
    blob_bound,
    check_name,
    digest_bytes,
)
from cache_backends.bounded import MAX_REF_BYTES
from cache_backends.local import beneath
from cache_backends.local.counters import LocalCountersMixin
from cache_backends.local.fetch import DEFAULT_FETCH_WAIT_S, LocalFetchMixin
from cache_backends.local.files import SUSPECT, LocalFilesMixin, drop_ident, warn_if_writable_by_others
from cache_backends.local.heal import heal
from cache_backends.local.leases import LocalLeasesMixin
from cache_backends.local.upkeep import (  # noqa: F401 - manifest_blob_digests, the constants: re-exported
    EVICT_TARGET_FRACTION, SIZE_RESCAN_S, STALE_TEMP_S, LocalUpkeepMixin, manifest_blob_digests)
from cache_backends.local.url import make_file_url, parse_file_url
from cache_backends.redaction import redact_url, redacting
from precompile import config
from precompile.errors import CacheError, CacheUnavailableError, CacheURLError, NotRegularFileError

__all__ = ["LocalCache", "manifest_blob_digests"]

log = logging.getLogger("precompile.cache")


#: Default zstd level for blobs at rest.
DEFAULT_LEVEL = 3
#: Default age, in seconds, below which an unreferenced blob is never evicted (a writer's ref may not be set yet).
DEFAULT_GRACE_S = 60.0
_MAX_READ_THREADS = 8


class LocalCache(LocalUpkeepMixin, LocalCountersMixin, LocalFilesMixin, LocalFetchMixin, LocalLeasesMixin, Cache):
    """A blob store + ref table + counters in one directory; many processes may share it.

    Args:
        root: the cache directory (created on first use, with its parents).
        max_bytes: size cap of ``blob/`` in bytes (compressed, as stored); LRU eviction above it.  Default
            :func:`precompile.config.local_max_bytes` (``$PRECOMPILE_CACHE_MAX_BYTES``, 20 GiB).
        read_only: never write: ``put_blob``/``set_ref``/``delete_ref``/``evict`` raise
            :class:`CacheReadOnlyError`, counters stay in memory, a hit does not refresh the LRU time.
        grace_s: seconds; an unreferenced blob younger than this is never evicted, so a concurrent writer's
            fresh blobs survive until its ref lands.
        level: zstd compression level of new blobs.
        referenced_digests: overrides :attr:`referenced_digests` for this instance.
        create: False to open an existing cache only (commands that read or tidy one): a missing ``root`` is an
            error and no directory is created.
        fetch_wait_s: seconds a process waits for another process of the host to fetch blobs into this cache from
            a remote tier (:mod:`cache_backends.local.fetch`); 0: no per-host fetch lock.

    Raises:
        CacheUnavailableError: ``root`` exists and is not a directory, or cannot be created for a reason other
            than permissions (a directory that cannot be written makes the cache read-only instead), or does
            not exist and ``create`` is False.
        ValueError: ``max_bytes`` is not a positive integer or ``grace_s`` is negative.
    """

    #: ``manifest bytes -> digests it keeps alive``; eviction keeps every blob some remaining ref's manifest names.
    #: A plain function assigned here (or on an instance) is called with the manifest bytes only.
    referenced_digests: ClassVar[Callable[[bytes], Iterable[str]]] = staticmethod(manifest_blob_digests)

    def __init__(
        self,
        root: str | os.PathLike[str],
        max_bytes: int | None = None,
        read_only: bool = False,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        level: int = DEFAULT_LEVEL,
        referenced_digests: Callable[[bytes], Iterable[str]] | None = None,
        create: bool = True,
        fetch_wait_s: float = DEFAULT_FETCH_WAIT_S,
    ):
        self.root = Path(os.path.abspath(os.path.expanduser(os.fspath(root))))
        self._max_bytes_given = max_bytes is not None
        self.max_bytes = int(max_bytes) if max_bytes is not None else config.local_max_bytes()
        if self.max_bytes <= 0:
            raise ValueError(f"max_bytes must be a positive number of bytes, got {max_bytes!r}")
        if grace_s < 0:
            raise ValueError(f"grace_s must be >= 0 seconds, got {grace_s!r}")
        self.grace_s = float(grace_s)
        self.fetch_wait_s = max(0.0, float(fetch_wait_s))
        self.level = int(level)
        self._configured_read_only = bool(read_only)
        self.read_only = bool(read_only)
        self._read_only_reason = "it was opened with read_only=True" if read_only else ""
        if referenced_digests is not None:
            self.referenced_digests = referenced_digests  # type: ignore[misc]
        self._blob_dir = self.root / "blob"
        self._ref_dir = self.root / "ref"
        self._lock_dir = self.root / "locks"
        self._tmp_dir = self.root / "tmp"
        self._stats_path = self.root / "stats.json"
        self._pending: Counter[str] = Counter()
        self._pending_lock = threading.Lock()
        self._leases, self._leases_mutex = {}, threading.Lock()  # build leases held (cache_backends.local.leases)
        self._warned_stats = False
        self._size_estimate: int | None = None
        self._size_scanned_at = 0.0
        self.url = self._make_url()
        if self.root.exists() and not self.root.is_dir():
            raise CacheUnavailableError(f"cache directory {self.root} exists and is not a directory")
        if not create and not self.root.is_dir():
            raise CacheUnavailableError(f"no cache at {self.url}: {self.root} does not exist (nothing was created; "
                                        "a command that writes, such as warmup or import, creates it)")
        if not self.read_only and create:
            self._make_directories()
        warn_if_writable_by_others(self.root, (self.root, self._blob_dir, self._ref_dir, self._lock_dir, self._tmp_dir))

    # ------------------------------------------------------------------------------------------------ URLs
    @classmethod
    def from_url(cls, url: str, *, create: bool = True) -> LocalCache:
        """Open ``file:///abs/dir[?options]`` (the form and its options: :func:`.url.parse_file_url`); ``create``
        as the constructor.

        Raises:
            CacheURLError: as :func:`.url.parse_file_url`, or an option out of the constructor's range.
            CacheUnavailableError: as the constructor.
        """
        with redacting(url):
            path, kwargs = parse_file_url(url)
            try:
                return cls(path, **kwargs, create=create)  # type: ignore[arg-type]
            except ValueError as err:
                if isinstance(err, CacheError):
                    raise
                raise CacheURLError(f"invalid cache URL {redact_url(url)!r}: {err}") from err

    def _make_url(self) -> str:
        opts: dict[str, object] = {}
        if self._max_bytes_given:
            opts["max_bytes"] = self.max_bytes
        if self._configured_read_only:
            opts["read_only"] = 1
        if self.grace_s != DEFAULT_GRACE_S:
            opts["grace_s"] = repr(self.grace_s)
        if self.level != DEFAULT_LEVEL:
            opts["level"] = self.level
        if self.fetch_wait_s != DEFAULT_FETCH_WAIT_S:
            opts["fetch_wait"] = repr(self.fetch_wait_s)
        return make_file_url(self.root.as_posix(), opts)

    # ------------------------------------------------------------------------------------------------ paths
    def _blob_path(self, digest: str) -> Path:
        return self._blob_dir / digest[:2] / digest[2:]

    def _ref_path(self, key: str) -> Path:
        return self._ref_dir / key

    # ------------------------------------------------------------------------------------------------ blobs
    def get_blob(self, digest: str, max_bytes: int | None = None) -> bytes | _Miss:
        """Bytes of blob ``digest`` (uncompressed, verified against the digest), or :data:`MISS`.

        A stored copy that does not decompress or does not hash to ``digest``, or whose file is not a regular file
        (a FIFO, a device, a directory: never opened in a way that blocks), is deleted, counted under ``errors``,
        logged as a warning and reported as :data:`MISS`.  One whose file or content is larger than ``max_bytes``
        bytes (uncompressed; default and cap :data:`~cache_backends.bounded.MAX_BLOB_BYTES`) is refused before it
        is allocated: a miss counted under ``errors`` and ``over_limit``, left in place.  Counts ``bytes_read``
        (compressed bytes read from disk).

        Raises:
            ValueError: ``digest`` is not 64 lowercase hex characters.
            CacheUnavailableError: the file exists but cannot be read (permissions, I/O error).
        """
        check_name(digest)
        data, nread, nerr = self._read_blob(digest, blob_bound(max_bytes, digest))
        self._count(bytes_read=nread, errors=nerr)
        return data

    def get_blobs(self, digests: list[str], max_bytes: Bounds = None) -> dict[str, bytes | _Miss]:
        """``{digest: bytes or MISS}``, read and verified in a few threads (zstd and sha256 release the GIL), each
        bounded as :meth:`get_blob` by ``max_bytes`` (one bound, or one per digest:
        :data:`~cache_backends.base.Bounds`).

        Raises:
            ValueError: a digest is not 64 lowercase hex characters (checked before anything is read).
            CacheUnavailableError: a file exists but cannot be read.
        """
        unique = list(dict.fromkeys(check_name(d) for d in digests))
        bounds = [blob_bound(max_bytes, d) for d in unique]
        if len(unique) <= 1:
            results = [self._read_blob(d, b) for d, b in zip(unique, bounds)]
        else:
            with ThreadPoolExecutor(max_workers=min(_MAX_READ_THREADS, len(unique))) as pool:
                results = list(pool.map(self._read_blob, unique, bounds))
        self._count(bytes_read=sum(r[1] for r in results), errors=sum(r[2] for r in results))
        return {d: r[0] for d, r in zip(unique, results)}

    def has_blob(self, digest: str) -> bool:
        """True if a blob file exists under ``digest`` (not verified; a ``stat`` that never follows a link).

        Raises:
            ValueError: ``digest`` is not 64 lowercase hex characters.
            CacheUnavailableError: the directory cannot be read (permissions, I/O error).
        """
        path = self._blob_path(check_name(digest))
        try:
            return stat.S_ISREG(beneath.lstat(self.root, path).st_mode)  # a link is no blob
        except (FileNotFoundError, NotRegularFileError):
            return False
        except OSError as err:
            raise CacheUnavailableError(f"could not stat blob {digest} under {self.root}: {err}") from err

    def put_blob(self, data: bytes, digest: str | None = None) -> str:
        """Store ``data`` zstd-compressed (idempotent) and return its digest (sha256 hex of ``data``).

        An existing blob is not rewritten (but for one a read in this process refused as over its bound); its mtime
        is refreshed so eviction's grace period protects it until the caller's ref lands.  Anything but a regular file under its name (a directory, a FIFO, a symlink) is
        replaced, counted under ``errors``.  Counts ``puts`` and ``bytes_written`` (compressed bytes) for new blobs only.

        Raises:
            ValueError: ``digest`` is given and is not the sha256 of ``data`` (or not 64 lowercase hex).
            CacheReadOnlyError: the cache is read-only (configured, or the directory is not writable).
            CacheUnavailableError: the disk is full or another write error occurred; no partial file is left.
        """
        actual = digest_bytes(data)
        if digest is not None and check_name(digest) != actual:
            raise ValueError(f"put_blob: digest {digest} given, but the data hashes to {actual}")
        self._check_writable()
        path = self._blob_path(actual)
        try:
            heal(self, path, f"blob {actual[:12]}")
            if actual in SUSPECT:  # a read here refused the stored copy as over its bound: replace it
                raise FileNotFoundError(path)
            beneath.touch(self.root, path)
            return actual
        except FileNotFoundError:
            SUSPECT.discard(actual)
        except OSError as err:
            if beneath.lstat_or_none(self.root, path) is not None:  # someone else's file we may not touch: it is
                return actual                                       # there, good enough
            raise self._write_error(err, f"blob {actual}") from err
        packed = zstandard.ZstdCompressor(level=self.level).compress(bytes(data))
        try:
            self._write_atomic(path, packed)
        except OSError as err:
            raise self._write_error(err, f"blob {actual}") from err
        if self._size_estimate is not None:
            self._size_estimate += len(packed)
        self._count(puts=1, bytes_written=len(packed))
        return actual

    # ------------------------------------------------------------------------------------------------- refs
    def get_ref(self, key: str) -> str | _Miss:
        """The digest stored under artifact key ``key``, or :data:`MISS`.  A hit refreshes the ref file's mtime
        (the LRU clock) unless the cache is read-only.  A ref file that does not hold a digest, or is not a regular
        file (a symlink, a FIFO, a device, a directory: opened without blocking or following, never read), is
        dropped (a link itself, never what it names), counted under ``errors``, logged by its size and sha256
        (never its bytes) and reported as :data:`MISS`; at most 256 bytes of a ref are read.

        Raises:
            ValueError: ``key`` is not 64 lowercase hex characters.
            CacheUnavailableError: the ref file exists but cannot be read.
        """
        path = self._ref_path(check_name(key, "artifact key"))
        st: os.stat_result | None = None
        try:
            with beneath.open_file(self.root, path, "cache ref") as f:
                st = os.fstat(f.fileno())
                text = f.read(MAX_REF_BYTES)
                digest = text.decode("ascii", "replace").strip()
                if HEX64.match(digest):
                    if not self.read_only:
                        with contextlib.suppress(OSError):
                            os.utime(f.fileno())  # the file read, never a name that may have been replaced
                    return digest
                why = f"it holds {st.st_size} bytes (sha256 {digest_bytes(text)[:16]}), not a digest"
        except FileNotFoundError:
            return MISS
        except NotRegularFileError as err:  # a link, a FIFO, a directory: never followed or read, dropped
            why = str(err)
        except OSError as err:
            raise CacheUnavailableError(f"could not read ref {key} under {self.root}: {err}") from err
        log.warning("cache ref %s under %s is unusable (%s); dropped, treated as a miss", key, self.root, why)
        ident = drop_ident(self.root, path, st)
        if not self.read_only and ident is not None:
            with contextlib.suppress(OSError):
                self._remove_unless(path, lambda s: (s.st_dev, s.st_ino) != ident)
        self._count(errors=1)
        return MISS

    def set_ref(self, key: str, digest: str) -> None:
        """Point ``key`` at ``digest`` atomically (write the blobs it names first), then evict least recently
        used artifacts if ``blob/`` holds more than ``max_bytes`` bytes.  An eviction failure is logged, not raised.
        Anything but a regular file under the ref's name (a directory, a FIFO) is replaced, counted under ``errors``.

        Raises:
            ValueError: ``key`` or ``digest`` is not 64 lowercase hex characters.
            CacheReadOnlyError: the cache is read-only (configured, or the directory is not writable).
            CacheUnavailableError: the disk is full or another write error occurred; the old ref (if any) stays.
        """
        check_name(key, "artifact key")
        check_name(digest)
        self._check_writable()
        try:
            heal(self, self._ref_path(key), f"ref {key[:12]}")
            self._write_atomic(self._ref_path(key), (digest + "\n").encode("ascii"))
        except OSError as err:
            raise self._write_error(err, f"ref {key}") from err
        try:
            self._maybe_evict()
        except Exception as err:  # eviction is upkeep: never fail the store that triggered it
            log.warning("eviction in cache %s failed: %s", self.root, err, exc_info=log.isEnabledFor(logging.DEBUG))

    def delete_ref(self, key: str, digest: str | None = None) -> bool:
        """Remove ref ``key``; True if it existed (with ``digest``: if it named that digest, and was not replaced
        meanwhile).  Its blobs stay until eviction finds them unreferenced.

        Raises:
            ValueError: ``key`` is not 64 lowercase hex characters.
            CacheReadOnlyError: the cache is read-only (configured, or the directory is not writable).
            CacheUnavailableError: another error prevented the removal.
        """
        path = self._ref_path(check_name(key, "artifact key"))
        self._check_writable()
        try:
            if digest is not None:
                return self._remove_ref_naming(path, digest)
            beneath.unlink(self.root, path)
        except FileNotFoundError:
            return False
        except OSError as err:
            raise self._write_error(err, f"ref {key}") from err
        return True

    def iter_refs(self) -> Iterator[tuple[str, str]]:
        """Yield ``(key, digest)`` for every well-formed ref, in no particular order.

        Raises:
            CacheUnavailableError: the ref directory cannot be listed or a ref cannot be read.
        """
        for key, digest, _ in self._scan_refs():
            yield key, digest

    def stats(self) -> dict[str, object]:
        """Counters, ``hit_rate`` (0..1), ``url``, ``backend``, ``root``, ``bytes_stored`` (compressed bytes in
        ``blob/``) and ``max_bytes``.  JSON-ready.

        Raises:
            CacheUnavailableError: ``blob/`` cannot be listed.
        """
        out = super().stats()
        out.update(root=str(self.root), bytes_stored=self.size_bytes(), max_bytes=self.max_bytes)
        return out

    def close(self) -> None:
        """Try once more to persist counters kept in memory (waiting at most
        :data:`~cache_backends.local.counters.EXIT_LOCK_WAIT_S` for the stats lock); nothing else to release.
        Never raises."""
        self.close_counters()

