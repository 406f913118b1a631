"""Build leases of a local cache directory, so that the processes of one host that share it build each key once.

:func:`precompile.store.coordination.get_or_build` takes a key's lease before it builds, and a process that finds
the lease taken waits for the ref instead (tensor-parallel ranks, data-parallel replicas, several serving
processes starting at once on one cache directory).  Here a lease is an exclusive ``flock`` (``filelock``) on
``locks/lease/<key>.lock``, held through an open file of the builder's process:

- the kernel drops it when that process exits or is killed, so a dead builder's lease ends at once (there is no
  expiry to wait out; ``ttl_s`` is accepted for the interface and not used, and renewing only says whether the
  lease is still held);
- a stalled builder keeps it: waiters build themselves after the cache's ``wait_s``, which is safe, since an
  artifact is content-addressed and its ref written last (the lease only saves work);
- one file per key, so builds of different keys never wait for each other, nested ones included (a whole
  function's build under its lease builds its pieces under theirs).  The holder removes the file before it gives
  the lock back (if the name is still its file), and ``filelock`` counts a lock on a file removed meanwhile as not
  taken, so nobody holds a lease on a file that is gone while another takes one on a new file of that name.  A
  file a dead builder left is taken over, then removed.

A lease lives as long as the cache object that took it holds it: one that is garbage-collected gives its leases
back.  A read-only cache takes no lease (:class:`~precompile.errors.CacheReadOnlyError`) and creates nothing: it only
looks whether a lock file exists and is held, to wait for another process's build.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import secrets
import threading
from pathlib import Path

import filelock

from cache_backends.base import HEX64
from cache_backends.local.heal import lock_file
from precompile.errors import CacheError, CacheReadOnlyError

log = logging.getLogger("precompile.cache")


class LocalLeasesMixin:
    """``acquire_lease``, ``renew_lease``, ``release_lease`` and ``lease_held`` of a
    :class:`~cache_backends.local.cache.LocalCache` (which provides ``root``, ``_lock_dir`` and ``read_only``)."""

    root: Path
    _lock_dir: Path
    read_only: bool
    #: ``{token: (key, its held lock, its file's (st_dev, st_ino))}`` of the leases this instance holds, under
    #: ``_leases_mutex``
    _leases: dict[str, tuple[str, filelock.BaseFileLock, tuple[int, int]]]
    _leases_mutex: threading.Lock
    supports_leases = True

    def _lease_file(self, key: str) -> Path:
        if not isinstance(key, str) or not HEX64.fullmatch(key):
            raise ValueError(f"a build lease is taken on an artifact key (64 hex), got {str(key)[:80]!r}")
        return self._lock_dir / "lease" / f"{key}.lock"

    def acquire_lease(self, key: str, ttl_s: float | None = None) -> str | None:
        """Take the build lease of ``key``: a random token, or None if another process (or thread) holds it.

        Raises:
            ValueError: ``key`` is not 64 hex.
            CacheReadOnlyError: the cache is read-only.
            CacheError: the lock file cannot be made or locked (a full disk, a file system without ``flock``).
        """
        path = self._lease_file(key)
        if self.read_only:
            raise CacheReadOnlyError(f"cache {self.root} is read-only: it takes no build lease")
        locked: list[tuple[int, int]] = []

        def note_file(fd: int) -> None:  # called by filelock with the locked file's descriptor
            st = os.fstat(fd)
            locked.append((st.st_dev, st.st_ino))

        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = filelock.FileLock(lock_file(self.root, path), is_singleton=False, thread_local=False,
                                     fallback_to_soft=False, on_acquired=note_file)
            lock.acquire(timeout=0)
        except filelock.Timeout:
            return None
        except (OSError, NotImplementedError) as err:
            raise CacheError(f"cannot take the build lease of {key[:12]} in {self.root}: {err}") from err
        token = secrets.token_hex(16)
        with self._leases_mutex:
            self._leases[token] = (key, lock, locked[-1] if locked else (-1, -1))
        return token

    def renew_lease(self, key: str, token: str, ttl_s: float | None = None) -> bool:
        """True if ``token`` still holds the lease of ``key`` (it lasts as long as this process holds it)."""
        with self._leases_mutex:
            entry = self._leases.get(token)
        return entry is not None and entry[0] == key and entry[1].is_locked

    def release_lease(self, key: str, token: str) -> bool:
        """Give the lease of ``key`` back if ``token`` holds it; True if it did."""
        with self._leases_mutex:
            entry = self._leases.get(token)
            if entry is None or entry[0] != key:
                return False
            del self._leases[token]
        _, lock, ident = entry
        path = self._lease_file(key)
        try:
            st = os.lstat(path)
            if (st.st_dev, st.st_ino) == ident:  # still our file: removed while locked (see the module docstring)
                os.unlink(path)
        except OSError as err:
            log.debug("removing the build lease file of %s: %s", key[:12], err)
        try:
            lock.release()
        except OSError as err:  # the kernel drops it with the descriptor anyway
            log.debug("releasing the build lease of %s: %s", key[:12], err)
        return True

    def lease_held(self, key: str) -> bool:
        """True if some process (this one included) holds the lease of ``key`` now.  Creates nothing: a lock file
        that is not there, or not a regular file, is no lease.

        Raises:
            CacheError: the lock file exists and cannot be opened.
        """
        path = self._lease_file(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return False
        except OSError as err:
            if err.errno == errno.ELOOP:  # a link planted there: no lease (taking one replaces it)
                return False
            raise CacheError(f"cannot see the build lease of {key[:12]} in {self.root}: {err}") from err
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError as err:
            raise CacheError(f"cannot see the build lease of {key[:12]} in {self.root}: {err}") from err
        finally:
            os.close(fd)  # drops the shared lock just taken, if it was
        return False
