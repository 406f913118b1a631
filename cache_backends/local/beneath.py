"""A local cache's files, reached beneath its root without following a link.

A cache directory may be shared (a 1777 near tier): whoever can write there can put a symbolic link where a ref, a
blob, a lock or the counters belong, pointing at a file only this process may read or write.  Nothing here follows
one.  The root is opened as configured (a link there is the operator's choice); every name below it is opened
relative to its parent directory's descriptor (``openat``) with ``O_NOFOLLOW``, so a link anywhere below the root, in
a file's place or in a directory's, is refused: a read finds no file (a miss, never the bytes of what the link
names), and a write, a rename or a removal never acts through it.  Writers replace what stands where a directory
belongs (:func:`directory` with ``create``) and where a file belongs (:func:`cache_backends.local.heal.displace`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from cache_backends.bounded import NOT_A_FILE, describe_mode, read_bounded, regular_file
from precompile.errors import NotRegularFileError

log = logging.getLogger("precompile.cache")

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
#: How a directory below the root is opened: never through a link (a link there fails with ENOTDIR).
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
#: How a file is opened for reading: never through a link (ELOOP), never blocking (a FIFO).
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | _CLOEXEC


def _kind(parent: int, name: str) -> str:
    """What stands under ``name`` in directory ``parent`` (itself, never what a link names), in words."""
    try:
        return describe_mode(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return "something"


def _subdir(parent: int, name: str, path: Path, create: bool) -> int:
    """A descriptor of directory ``name`` in ``parent`` (``path`` is its full name, for messages), never opened
    through a link; with ``create``, made when missing, and what stands in its place removed first."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
    except NotADirectoryError as err:
        kind = _kind(parent, name)
        if not create:
            raise NotRegularFileError(f"cache directory {path} is {kind}, not a directory; refused without following "
                                      "it") from err
        try:
            os.unlink(name, dir_fd=parent)  # a link is removed itself, never what it names
        except OSError as unlink_err:
            raise NotRegularFileError(f"cache directory {path} is {kind}, not a directory, and cannot be replaced "
                                      f"({unlink_err.strerror or unlink_err}); refused without following it") from err
        log.warning("cache directory %s was %s, not a directory; replaced", path, kind)
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, dir_fd=parent)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except NotADirectoryError as err:  # replaced again meanwhile
        raise NotRegularFileError(f"cache directory {path} is {_kind(parent, name)}, not a directory; refused "
                                  "without following it") from err


@contextlib.contextmanager
def directory(root: Path, path: Path, *, create: bool = False) -> Iterator[int]:
    """A descriptor of directory ``path`` (``root`` or below it), every name below ``root`` opened without following
    a link; closed on exit.

    Args:
        create: for writers: make what is missing (``root`` too), and replace what stands where a directory
            belongs (a link, a file: removed itself, logged).

    Raises:
        FileNotFoundError: ``path`` does not exist (and ``create`` is False).
        NotRegularFileError: a link or anything but a directory stands where one of ``path``'s directories belongs
            (and ``create`` is False, or it cannot be removed).
        OSError: another failure (permissions...).
        ValueError: ``path`` is not below ``root`` (a caller's mistake).
    """
    names = path.relative_to(root).parts
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    except FileNotFoundError:
        if not create:
            raise
        os.makedirs(root, exist_ok=True)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    try:
        here = root
        for name in names:
            here = here / name
            below = _subdir(fd, name, here, create)
            os.close(fd)
            fd = below
        yield fd
    finally:
        os.close(fd)


def open_in(parent: int, path: Path, what: str) -> IO[bytes]:
    """Regular file ``path.name`` of the open directory ``parent`` (``path`` names it in messages), opened for
    reading (binary, unbuffered) without blocking and without following a link.

    Raises:
        FileNotFoundError: it does not exist.
        NotRegularFileError: it is a symbolic link, a FIFO, a device, a directory or a socket (nothing is read).
        OSError: another failure to open it.
    """
    try:
        fd = os.open(path.name, _READ_FLAGS, dir_fd=parent)
    except OSError as err:
        if err.errno in NOT_A_FILE:
            kind = "a symbolic link" if err.errno == errno.ELOOP else _kind(parent, path.name)
            raise NotRegularFileError(f"{what} {path} is {kind}, not a regular file; refused without following or "
                                      "reading it") from err
        raise
    return regular_file(fd, path, what)


def open_file(root: Path, path: Path, what: str) -> IO[bytes]:
    """Regular file ``path`` below ``root``, opened for reading as :func:`open_in`, no name on the way followed
    through a link.

    Raises:
        FileNotFoundError: it (or a directory on the way) does not exist.
        NotRegularFileError: it, or a directory on the way, is a link or another kind of file (nothing is read).
        OSError: another failure to open it.
    """
    with directory(root, path.parent) as parent:
        return open_in(parent, path, what)


def read_file(root: Path, path: Path, max_bytes: int, what: str) -> bytes:
    """The bytes of regular file ``path`` below ``root`` (:func:`open_file`), at most ``max_bytes`` of them.

    Raises:
        FileNotFoundError / NotRegularFileError / OSError: as :func:`open_file`.
        InputLimitError: it holds more than ``max_bytes`` bytes (refused before anything is allocated).
    """
    with open_file(root, path, what) as f:
        return read_bounded(f, max_bytes, f"{what} {path}")


def lstat(root: Path, path: Path) -> os.stat_result:
    """``os.lstat(path)`` (a link is judged itself), no directory on the way followed through a link.

    Raises:
        FileNotFoundError / NotRegularFileError / OSError: as :func:`open_file`.
    """
    with directory(root, path.parent) as parent:
        return os.stat(path.name, dir_fd=parent, follow_symlinks=False)


def lstat_or_none(root: Path, path: Path) -> os.stat_result | None:
    """:func:`lstat`, or None when it cannot be had."""
    try:
        return lstat(root, path)
    except OSError:
        return None


def touch(root: Path, path: Path) -> None:
    """Set the modification time of ``path`` (the LRU clock) to now; a link is never followed (its own time is
    set, never its target's).

    Raises:
        FileNotFoundError / NotRegularFileError / OSError: as :func:`lstat`.
    """
    with directory(root, path.parent) as parent:
        os.utime(path.name, dir_fd=parent, follow_symlinks=False)


def unlink(root: Path, path: Path) -> None:
    """Remove the name ``path`` (a link is removed itself), no directory on the way followed through a link.

    Raises:
        FileNotFoundError / NotRegularFileError / OSError: as :func:`lstat`.
    """
    with directory(root, path.parent) as parent:
        os.unlink(path.name, dir_fd=parent)
