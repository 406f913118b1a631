"""The counters of a local cache: ``stats.json``, updated by a read-modify-write under ``locks/stats.lock``.

Counts that cannot be persisted (read-only cache, lock timeout, write error) stay in memory and are retried on the
next increment; :meth:`LocalCountersMixin.counters` shows both.
"""

from __future__ import annotations

import json
import logging
import threading
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

#: Seconds ``incr`` waits for the stats lock before keeping the counts in memory.
STATS_LOCK_TIMEOUT_S = 10.0
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
        ``bytes_*``).  Persisted in ``stats.json`` by a read-modify-write under ``locks/stats.lock``.

        Never raises: when the counts cannot be persisted (read-only cache, lock timeout after
        ``STATS_LOCK_TIMEOUT_S`` seconds, write error) they are kept in memory, added to :meth:`counters`, retried
        on the next call, and the first failure is logged once per instance.

        The backend counts ``puts``, ``bytes_read``, ``bytes_written``, ``errors`` and ``evictions`` itself;
        ``hits``, ``misses`` and ``builds`` are counted by the artifact layer.
        """
        with self._pending_lock:
            add_counts(self._pending, counts)
            if self._configured_read_only or not self._pending:
                return
            try:
                self._lock_dir.mkdir(parents=True, exist_ok=True)
                lock = filelock.FileLock(lock_file(self.root, self._lock_dir / "stats.lock"),
                                         timeout=STATS_LOCK_TIMEOUT_S)
                with lock:
                    current = Counter(self._read_stats())
                    current.update(self._pending)
                    doc = ordered_counters(current)
                    # atomic but not fsynced: counters are not worth an fsync per call; a file a crash left
                    # empty reads as zeros (with a warning), it never breaks the cache
                    self._write_atomic(self._stats_path, json.dumps(doc, indent=1).encode(), fsync=False)
                self._pending.clear()
            except Exception as err:  # incr never raises
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
