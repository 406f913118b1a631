"""The write side of a local cache's self-healing: a name the cache writes (a blob or a ref) that holds something
the cache never writes there, a directory, a FIFO, a symlink, a socket or a device, is moved aside and removed
before the write, so that the next store replaces it (issue 30).  Reads refuse such entries (a miss, never a hang:
:mod:`cache_backends.bounded`); without this, ``put_blob`` would take a directory for an existing blob and
``set_ref`` could never replace one, and every later load would miss.

Only what is not a regular file is touched: a regular file under a blob's name is the blob (its reader verifies it),
so nothing a writer stored is ever removed here.
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

log = logging.getLogger("precompile.cache")

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def displace(path: Path, tmp_dir: Path) -> str | None:
    """Make ``path`` free for a regular file: if it holds anything else (a symlink is judged itself, never
    followed), rename it into ``tmp_dir`` under a unique name (atomic) and remove it there.

    Returns:
        what was moved aside (``"a directory"``, ``"a FIFO"``...), or None when ``path`` is absent or a regular
        file (left alone).

    Raises:
        OSError: it could not be moved aside (a directory that cannot be removed once aside is only logged: the
            name is free either way).
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), f"mode {oct(mode)}")
    tmp_dir.mkdir(parents=True, exist_ok=True)
    aside = tmp_dir / f"{path.name}.{uuid.uuid4().hex}.displaced"
    try:
        os.rename(path, aside)
    except FileNotFoundError:  # another writer moved it first
        return None
    try:
        if stat.S_ISDIR(mode):
            shutil.rmtree(aside)  # never follows a symlink inside it
        else:
            os.unlink(aside)
    except OSError as err:
        log.debug("could not remove %s moved aside from %s: %s", aside, path, err)
        with contextlib.suppress(OSError):
            os.chmod(aside, 0o700)
    return kind


def heal(cache: Any, path: Path, what: str) -> None:
    """Free ``path`` of a :class:`~cache_backends.local.cache.LocalCache` (``cache``) before a write (:func:`displace`),
    logged (a warning naming ``what``) and counted under the cache's ``errors``.

    Raises:
        OSError: it could not be moved aside.
    """
    kind = displace(path, cache._tmp_dir)
    if kind is not None:
        log.warning("cache %s: %s was %s, not a file; replaced", cache.root, what, kind)
        cache._count(errors=1)
