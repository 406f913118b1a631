"""The counters of a local cache: ``stats.json``, updated by a read-modify-write under ``locks/stats.lock``.

An increment never waits for the lock: it tries it once, without blocking.  Counts that cannot be persisted now
(the lock held by another process, a read-only cache, a write error) stay in memory, are folded in by the next
increment that gets the lock, and by :meth:`LocalCountersMixin.close_counters` (``close()``) and at process exit,
which wait for it at most :data:`EXIT_LOCK_WAIT_S`; :meth:`LocalCountersMixin.counters` shows both.  So a process
of another user that holds ``flock`` on the lock file (a 0644 file: ``flock`` needs only read access) costs a load
nothing, and its counts reach ``stats.json`` once the lock is free.
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
import weakref
from collections import Counter
from pathlib import Path

import filelock

from cache_backends.base import add_counts, ordered_counters
from cache_backends.bounded import loads_json
from cache_backends.local.beneath import read_file
from cache_backends.local.files import warn_once_per_root
from cache_backends.local.heal import lock_file
from precompile.errors import NotRegularFileError

log = logging.getLogger("precompile.cache")

#: Seconds ``close()`` and the exit hook wait for the stats lock before leaving the counts unpersisted (``incr``
#: never waits: it tries the lock once).  Another process holds it for one small read-modify-write, far less, but
#: on a loaded host many processes taking it in turn can hold it most of the time: the wait polls every
#: :data:`EXIT_POLL_S`, so that it finds the lock free between two of them.
EXIT_LOCK_WAIT_S = 2.0
EXIT_POLL_S = 0.001
#: Largest ``stats.json`` read, bytes (ours is a few hundred: one line per counter).
MAX_STATS_BYTES = 1 << 20


class LocalCountersMixin:
    """``incr``/``counters`` of a :class:`~cache_backends.local.cache.LocalCache` (which provides ``root``,
    ``_stats_path``, ``_lock_dir``, ``_pending``, ``_pending_lock``, ``_configured_read_only``, ``_warned_stats``
    and ``_write_atomic``)."""

    root: Path
    _stats_path: Path
    _lock_dir: Path
    _pending: Counter[str]
    _pending_lock: threading.Lock
    _configured_read_only: bool
    _warned_stats: bool

    def _read_stats(self) -> dict[str, int]:
        """The persisted counters; ``{}`` (with a warning) when ``stats.json`` is not a regular file, is over
        :data:`MAX_STATS_BYTES` bytes or does not parse: the next increment replaces it.

        Raises:
            OSError: it cannot be read (permissions, I/O error).
        """
        try:
            doc = loads_json(read_file(self.root, self._stats_path, MAX_STATS_BYTES, "cache counters"),
                             MAX_STATS_BYTES, "cache counters", max_depth=2)
            return {str(k): int(v) for k, v in doc.items() if isinstance(v, int)}
        except FileNotFoundError:
            return {}
        except (ValueError, AttributeError, NotRegularFileError) as err:  # InputLimitError is a ValueError
            log.warning("cache counters in %s are unusable (%s); starting them from zero", self._stats_path, err)
            return {}

    def _count(self, **counts: int) -> None:
        if any(counts.values()):
            self.incr(**counts)

    def incr(self, **counts: int) -> None:
        """Add to named counters, e.g. ``incr(hits=1, bytes_read=123)``; values are integers (bytes for
        ``bytes_*``).  Persisted in ``stats.json`` by a read-modify-write under ``locks/stats.lock``, taken only if
        it is free now: the call never waits for it.

        Never raises: when the counts cannot be persisted (the lock held by another process, a read-only cache, a
        write error) they are kept in memory, added to :meth:`counters`, folded in by the next call that gets the
        lock (or by ``close()`` or the exit hook), and a failure other than a held lock is logged once per
        instance.

        The backend counts ``puts``, ``bytes_read``, ``bytes_written``, ``errors`` and ``evictions`` itself;
        ``hits``, ``misses`` and ``builds`` are counted by the artifact layer.
        """
        self._persist(counts, 0.0)

    def close_counters(self) -> None:
        """Persist the counts kept in memory, waiting at most :data:`EXIT_LOCK_WAIT_S` seconds for the stats
        lock (what ``close()`` and the exit hook run).  Never raises; counts it cannot persist stay in memory."""
        if self._pending and not self._configured_read_only:
            self._persist({}, EXIT_LOCK_WAIT_S)

    def _persist(self, counts: dict[str, int], wait_s: float) -> None:
        """Add ``counts`` to the pending ones and write them all to ``stats.json`` if the stats lock can be had
        within ``wait_s`` seconds (0: one try, no wait)."""
        with self._pending_lock:
            add_counts(self._pending, counts)
            if self._configured_read_only or not self._pending:
                return
            try:
                lock = filelock.FileLock(lock_file(self.root, self._lock_dir / "stats.lock"))
                try:
                    lock.acquire(timeout=wait_s, poll_interval=EXIT_POLL_S, blocking=wait_s > 0)
                except filelock.Timeout:  # another process holds it: keep the counts for a later try
                    _UNPERSISTED.add(self)
                    log.debug("the stats lock of %s is held by another process; %d counter(s) kept in this process "
                              "for a later try", self.root, len(self._pending))
                    return
                try:
                    current = Counter(self._read_stats())
                    current.update(self._pending)
                    doc = ordered_counters(current)
                    # atomic but not fsynced: counters are not worth an fsync per call; a file a crash left
                    # empty reads as zeros (with a warning), it never breaks the cache
                    self._write_atomic(self._stats_path, json.dumps(doc, indent=1).encode(), fsync=False)
                finally:
                    lock.release()
                self._pending.clear()
                _UNPERSISTED.discard(self)
            except Exception as err:  # incr never raises
                _UNPERSISTED.add(self)
                if not self._warned_stats:
                    self._warned_stats = True
                    warn_once_per_root(
                        self.root, "counters",
                        f"cannot persist cache counters in {self.root} ({err}); keeping them in this process only",
                    )

    def counters(self) -> dict[str, int]:
        """Every counter in :data:`COUNTERS` (plus any other name ever incremented): persisted + pending in
        memory.  Never raises (an unreadable ``stats.json`` counts as empty)."""
        try:
            stored = Counter(self._read_stats())
        except OSError:
            stored = Counter()
        with self._pending_lock:
            stored.update(self._pending)
        return ordered_counters(stored)


#: Local caches of this process holding counts not yet persisted (the stats lock was held); the exit hook tries
#: them once more.  Weak: a cache dropped without ``close()`` is not kept alive for it.
_UNPERSISTED: weakref.WeakSet[LocalCountersMixin] = weakref.WeakSet()


@atexit.register
def _persist_at_exit() -> None:
    """Fold the counts kept in memory into ``stats.json`` before the process exits, waiting at most
    :data:`EXIT_LOCK_WAIT_S` per cache for its lock.  Never raises."""
    for cache in list(_UNPERSISTED):
        try:
            cache.close_counters()
        except Exception:  # noqa: BLE001 - at exit nothing may fail; close_counters never raises anyway
            pass
