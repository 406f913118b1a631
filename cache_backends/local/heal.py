"""The write side of a local cache's self-healing: a name the cache writes (a blob or a ref) that holds something
the cache never writes there, a directory, a FIFO, a symlink, a socket or a device, is moved aside and removed
before the write, so that the next store replaces it (issue 30).  Reads refuse such entries (a miss, never a hang:
:mod:`cache_backends.bounded`); without this, ``put_blob`` would take a directory for an existing blob and
``set_ref`` could never replace one, and every later load would miss.

Only what is not a regular file is touched: a regular file under a blob's name is the blob (its reader verifies it),
so nothing a writer stored is ever removed here.  Lock files are freed the same way (:func:`lock_file`): a symlink in
a lock's place is a planted one, and is replaced rather than followed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any

from cache_backends.bounded import describe_mode
from cache_backends.local import beneath

log = logging.getLogger("precompile.cache")


def displace(root: Path, path: Path, tmp_dir: Path) -> str | None:
    """Make ``path`` (below cache directory ``root``) free for a regular file: if it holds anything else (a symlink
    is judged itself, never followed), rename it into ``tmp_dir`` under a unique name (atomic) and remove it there.
    No directory on the way is followed through a link (:mod:`cache_backends.local.beneath`; one that stands where
    a directory belongs is replaced).

    Returns:
        what was moved aside (``"a directory"``, ``"a FIFO"``...), or None when ``path`` is absent or a regular
        file (left alone).

    Raises:
        OSError: it could not be moved aside (a directory that cannot be removed once aside is only logged: the
            name is free either way).
    """
    with beneath.directory(root, path.parent, create=True) as parent:
        try:
            mode = os.stat(path.name, dir_fd=parent, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return None
        if stat.S_ISREG(mode):
            return None
        kind = describe_mode(mode)
        aside = f"{path.name}.{uuid.uuid4().hex}.displaced"
        with beneath.directory(root, tmp_dir, create=True) as tmp:
            try:
                os.rename(path.name, aside, src_dir_fd=parent, dst_dir_fd=tmp)
            except FileNotFoundError:  # another writer moved it first
                return None
            try:
                if stat.S_ISDIR(mode):
                    shutil.rmtree(tmp_dir / aside)  # never follows a symlink inside it
                else:
                    os.unlink(aside, dir_fd=tmp)
            except OSError as err:
                log.debug("could not remove %s moved aside from %s: %s", tmp_dir / aside, path, err)
                with contextlib.suppress(OSError):
                    os.chmod(aside, 0o700, dir_fd=tmp)  # a directory: its contents were left
    return kind


def heal(cache: Any, path: Path, what: str) -> None:
    """Free ``path`` of a :class:`~cache_backends.local.cache.LocalCache` (``cache``) before a write (:func:`displace`),
    logged (a warning naming ``what``) and counted under the cache's ``errors``.

    Raises:
        OSError: it could not be moved aside.
    """
    kind = displace(cache.root, path, cache._tmp_dir)
    if kind is not None:
        log.warning("cache %s: %s was %s, not a file; replaced", cache.root, what, kind)
        cache._count(errors=1)


def lock_file(root: Path, path: Path) -> str:
    """The name of lock file ``path`` (below cache directory ``root``), made ready for ``filelock`` to open: its
    directories real ones (made, or replaced when a link stands there), and anything but a regular file in its
    place (a symlink, planted to make a worker lock, truncate or read a file elsewhere) moved aside, logged.
    ``filelock`` opens it with ``O_NOFOLLOW`` (3.20.1 on), so a link planted after this is refused there.  Never
    raises: what cannot be fixed is left for ``filelock`` to refuse (the caller then goes without the lock)."""
    try:
        kind = displace(root, path, root / "tmp")
    except OSError as err:
        log.debug("lock file %s cannot be made ready: %s", path, err)
    else:
        if kind is not None:
            log.warning("cache %s: lock file %s was %s, not a file; replaced", root, path.name, kind)
    return str(path)
