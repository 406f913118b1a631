"""One download per host: the lock a tiered cache takes in its local directory before fetching blobs from the remote.

N worker processes on one host behind ``file://DIR|redis://...`` that miss the same blobs at the same moment would
each fetch them from Redis.  Instead each takes, per blob, a lock file under ``DIR/locks/fetch/`` (``filelock``:
``flock``, released by the kernel when its holder exits or is killed), re-reads the local tier once it holds it
(double-checked, as dogpile's creator does), and fetches and backfills only what is still missing; the others
wait for the lock, then find the blobs in the local tier.  Locks are striped by the first three hex digits of the
digest (at most 4096 lock files), taken in order, so two processes never wait on each other in a circle.

Waiting is short and bounded: after ``fetch_wait`` seconds in all (default :data:`DEFAULT_FETCH_WAIT_S`, 1 s) a
process fetches without the lock, and says so once per process and directory (later at debug level).  A holder
may be stalled (SIGSTOP), on a file system whose locks do not work, or another user's process that only holds
the lock files (they are 0644, and ``flock`` needs no write access): it costs a near miss ``fetch_wait``, not the
time a fetch could take.  A lock that cannot be made (an unwritable ``locks/``) is skipped.  The lock only saves
downloads: correctness never depends on it (every blob is verified on every read).  A host whose remote fetches
often take longer than the wait (large blobs, a slow link) may set a longer ``fetch_wait``, at the cost of a longer
stall when the locks are squatted.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import TracebackType

import filelock

from cache_backends.local.heal import lock_file
from cache_backends.local.files import warn_once_per_root

log = logging.getLogger("precompile.cache")

#: Default seconds a process waits in all for other processes of its host to fetch the blobs it needs (then it
#: fetches them itself).
DEFAULT_FETCH_WAIT_S = 1.0


class FetchLock:
    """The per-host fetch locks of some blobs in one local cache directory; a context manager.

    Entering it takes the lock of every blob (waiting at most ``wait_s`` seconds in all) and returns the digests
    whose lock another process held when asked, so was waited for.  Leaving releases them.

    Args:
        lock_dir: the local cache's ``locks/`` directory (``fetch/`` is made in it).
        digests: the blobs about to be fetched.
        wait_s: the most seconds to wait in all; past it, the remaining locks are not taken.
    """

    def __init__(self, lock_dir: Path, digests: list[str], wait_s: float):
        self.dir = lock_dir / "fetch"
        self.digests = list(dict.fromkeys(digests))
        self.wait_s = float(wait_s)
        self._held: list[filelock.BaseFileLock] = []
        #: seconds spent waiting for other holders (0.0 when every lock was free)
        self.waited_s = 0.0
        #: stripes whose lock was not taken in time (then fetched without it)
        self.timed_out = 0

    def __enter__(self) -> set[str]:
        deadline = time.monotonic() + self.wait_s
        waited: set[str] = set()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            log.debug("no per-host fetch lock in %s: %s", self.dir, err)
            return waited
        for stripe in sorted({d[:3] for d in self.digests}):
            path = lock_file(self.dir.parent.parent, self.dir / f"{stripe}.lock")  # a link there: replaced
            lock = filelock.FileLock(path, is_singleton=False, fallback_to_soft=False)
            try:
                lock.acquire(timeout=0)
            except filelock.Timeout:
                waited.add(stripe)
                start = time.monotonic()
                try:
                    lock.acquire(timeout=max(0.0, deadline - start), poll_interval=0.01)
                except filelock.Timeout:
                    self.timed_out += 1
                    continue
                except (OSError, NotImplementedError) as err:  # as below: fetch without it
                    log.debug("per-host fetch lock %s not taken: %s", stripe, err)
                    continue
                finally:
                    self.waited_s += time.monotonic() - start
            except (OSError, NotImplementedError) as err:  # cannot make or lock the file: fetch without it
                log.debug("per-host fetch lock %s not taken: %s", stripe, err)
                continue
            self._held.append(lock)
        if self.timed_out:
            root = self.dir.parent.parent
            warn_once_per_root(root, "fetch lock",
                               f"waited {self.wait_s:.1f} s for another process of this host to fetch "
                               f"{len(self.digests)} blob(s) into {root}; fetching them here as well (a process that "
                               "holds the fetch locks in locks/fetch/ and does not fetch costs each near miss "
                               "fetch_wait seconds; said once per process)")
        return {d for d in self.digests if d[:3] in waited}

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        for lock in reversed(self._held):
            try:
                lock.release()
            except OSError as release_err:  # the kernel drops it with the descriptor anyway
                log.debug("releasing a fetch lock in %s: %s", self.dir, release_err)
        self._held.clear()


class LocalFetchMixin:
    """``fetch_lock`` of a :class:`~cache_backends.local.cache.LocalCache` (which provides ``_lock_dir``, ``read_only`` and
    ``fetch_wait_s``)."""

    _lock_dir: Path
    read_only: bool
    fetch_wait_s: float

    def fetch_lock(self, digests: list[str]) -> FetchLock | None:
        """The per-host lock on fetching ``digests`` into this directory (:class:`FetchLock`), or None when this
        cache is read-only (nothing is backfilled) or ``fetch_wait`` is 0."""
        if self.read_only or self.fetch_wait_s <= 0 or not digests:
            return None
        return FetchLock(self._lock_dir, digests, self.fetch_wait_s)
