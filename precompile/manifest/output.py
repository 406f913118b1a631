"""Files written for the user at a path they name (an exported bundle, a saved artifact): only a new name or a
regular file is ever replaced, atomically, through a temporary sibling that is created, never opened through a
name something else put there.

A device, a FIFO, a socket, a directory or a symlink at the path is refused before anything is written (as root,
``export -o /dev/full`` once replaced the device node with a regular file), and checked again just before the
rename, so that what appeared there meanwhile is not replaced either.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from precompile.errors import OutputPathError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def check_output(path: str | os.PathLike[str], what: str = "file") -> Path:
    """``path`` as a ``Path``, if writing there would replace nothing or a regular file (a symlink is not followed).

    Raises:
        OutputPathError: something else is there (a directory, a device, a FIFO, a socket, a symlink).
    """
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as err:  # ENOTDIR (a file as a directory), ELOOP, EACCES: nothing can be written there
        raise OutputPathError(f"cannot write {what} {path}: {err.strerror or err}") from err
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise OutputPathError(f"cannot write {what} {path}: it is {kind}; give the path of a new or regular file"
                              + (" inside it" if stat.S_ISDIR(mode) else ""))
    return path


@contextmanager
def replacing(path: str | os.PathLike[str], what: str = "file") -> Iterator[IO[bytes]]:
    """``with replacing(path) as f: f.write(...)``: the bytes written go to a new temporary sibling (``O_EXCL``,
    ``O_NOFOLLOW``, mode 0666 less the umask), which is synced and renamed onto ``path`` when the block ends, or
    removed if it raises.

    Raises:
        OutputPathError: ``path`` names something other than a regular file, before the write or at the rename
            (:func:`check_output`).
        FileNotFoundError: the directory of ``path`` does not exist.
        OSError: the file system refused the write.
    """
    path = check_output(path, what)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.incomplete")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        check_output(path, what)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
