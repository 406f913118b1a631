"""Reading, writing, removing and scanning files in a local cache directory (the file side of `LocalCache`).

Every read opens without blocking and only regular files (:mod:`cache_backends.bounded`), bounded by what its
caller accepts, and every name below the root is reached without following a link
(:mod:`cache_backends.local.beneath`): a link planted where a file or a directory belongs is a miss, never read or
written through.

Every write goes to ``<name>.<uuid4 hex>.incomplete`` beside its target, is flushed and fsynced, then moved into
place with :func:`os.replace`; a removal first renames the file into ``tmp/`` and checks it there, so a file a
concurrent writer just replaced is never removed.  A directory that cannot be written turns the cache read-only
(one warning per process and directory).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from cache_backends.base import HEX64, MISS, _Miss, decompress_frame, digest_bytes
from cache_backends.bounded import MAX_BLOB_BYTES, MAX_REF_BYTES, frame_bound, read_at_most
from cache_backends.local import beneath
from precompile.errors import (
    CacheError,
    CacheReadOnlyError,
    CacheUnavailableError,
    InputLimitError,
    NotRegularFileError,
)

log = logging.getLogger("precompile.cache")

#: Digests whose stored copy a read in this process refused as over its bound: the next store of one rewrites it.
SUSPECT: set[str] = set()

#: errno values that mean "this directory cannot be written by us": the cache turns read-only.
READ_ONLY_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
#: errno values that mean "no space": reported as unavailable storage.
FULL_ERRNOS = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})

_HEX62 = re.compile(r"^[0-9a-f]{62}\Z")
_HEX2 = re.compile(r"^[0-9a-f]{2}\Z")

_warned_roots: set[tuple[Path, str]] = set()
_warned_lock = threading.Lock()


def warn_once_per_root(root: Path, kind: str, message: str) -> None:
    """Log a warning about the state of a cache directory once per process (later ones at debug level): callers
    open a new :class:`LocalCache` per URL, and a read-only directory must not warn on every compile."""
    with _warned_lock:
        first = (root, kind) not in _warned_roots
        _warned_roots.add((root, kind))
    log.log(logging.WARNING if first else logging.DEBUG, "%s", message)



def drop_ident(root: Path, path: Path, st: os.stat_result | None) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` that the file under ``path`` (below cache directory ``root``) must still have for a
    reader that found it unusable (its stat ``st``) to drop it; a symlink's own (to ``/dev/zero``, to a file
    elsewhere: the link is removed, never what it names), compared by :meth:`LocalFilesMixin._remove_unless` with
    the name's own stat."""
    link = beneath.lstat_or_none(root, path)
    if link is not None and (st is None or stat.S_ISLNK(link.st_mode)):
        st = link
    return (st.st_dev, st.st_ino) if st is not None else None


def warn_if_writable_by_others(root: Path, directories: tuple[Path, ...]) -> None:
    """Warn (once per process and directory) about each of ``directories`` (``root`` and its own) that users other
    than its owner may write: its group or others have the write bit, sticky or not (a 1777 directory is the
    shared near tier: the sticky bit stops others from removing this user's files, not from planting their own)."""
    for d in directories:
        try:
            st = os.stat(d) if d == root else beneath.lstat(root, d)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            warn_once_per_root(d, "writable by others", (
                f"cache directory {d} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}): anyone who "
                "can write there can plant cache entries. Links are never followed out of it and every blob is "
                "checked against its digest, but only signatures stop a planted artifact: set PRECOMPILE_VERIFY_KEYS "
                "(or verify_keys= in the cache URL), or make the directory writable by its owner only"))


class LocalFilesMixin:
    """Bounded blob reads, atomic writes, checked removals, the read-only switch and the ref-file scan of a
    :class:`~cache_backends.local.cache.LocalCache` (which provides ``root``, ``read_only``, ``_read_only_reason``,
    ``_tmp_dir``, ``_ref_dir``, ``_blob_path`` and ``_count``)."""

    root: Path
    read_only: bool
    _read_only_reason: str
    _tmp_dir: Path
    _ref_dir: Path

    def _read_blob(self, digest: str, max_bytes: int = MAX_BLOB_BYTES) -> tuple[bytes | _Miss, int, int]:
        """``(bytes or MISS, compressed bytes read, errors)``; no counters touched (callers batch them), except
        ``over_limit``.  A file that is not a regular file is dropped; one over ``max_bytes`` is kept."""
        path = self._blob_path(digest)
        try:
            with beneath.open_file(self.root, path, "cache blob") as f:
                st = os.fstat(f.fileno())
                if st.st_size > frame_bound(max_bytes):
                    raise InputLimitError(f"its file holds {st.st_size} bytes, more than a blob of at most {max_bytes} "
                                          "bytes is stored as")
                raw = read_at_most(f, frame_bound(max_bytes), f"cache blob {digest}", st.st_size)
        except FileNotFoundError:
            return MISS, 0, 0
        except NotRegularFileError as err:
            self._drop_bad_blob(digest, path, None, str(err))
            return MISS, 0, 1
        except InputLimitError as err:
            return self._over_limit(digest, err), 0, 1
        except OSError as err:
            raise CacheUnavailableError(f"could not read blob {digest} under {self.root}: {err}") from err
        try:
            data = decompress_frame(raw, max_bytes)
        except InputLimitError as err:
            return self._over_limit(digest, err), len(raw), 1
        except ValueError as err:
            self._drop_bad_blob(digest, path, st, f"undecodable, {len(raw)} bytes on disk: {err}")
            return MISS, len(raw), 1
        if digest_bytes(data) != digest:
            self._drop_bad_blob(digest, path, st, "content does not hash to its name")
            return MISS, len(raw), 1
        return data, len(raw), 0

    def _over_limit(self, digest: str, err: InputLimitError) -> _Miss:
        """A blob larger than its reader accepts: a miss, logged, counted under ``over_limit``, left in place (the
        bound may be another reader's), and rewritten by this process's next ``put_blob`` of it: a copy whose
        digest says it is the blob a rebuild stores is replaced by that build's bytes, so it heals."""
        log.warning("cache blob %s under %s is refused: %s; treated as a miss and left in place", digest, self.root,
                    err)
        SUSPECT.add(digest)
        self._count(over_limit=1)
        return MISS

    def _make_directories(self) -> None:
        """Make ``tmp/``, ``blob/``, ``ref/`` and ``locks/`` (a link or a file in a directory's place is replaced,
        :func:`cache_backends.local.beneath.directory`).  A directory that cannot be written, or a link that cannot
        be replaced (another user's, in a sticky directory), turns the cache read-only: nothing is written through
        it, and reads refuse it (misses).

        Raises:
            CacheUnavailableError: a directory cannot be made for another reason.
        """
        try:
            for d in (self._tmp_dir, self._blob_dir, self._ref_dir, self._lock_dir):
                with beneath.directory(self.root, d, create=True):
                    pass
        except NotRegularFileError as err:
            self.read_only = True
            self._read_only_reason = str(err)
            warn_once_per_root(self.root, "read-only", self._read_only_message())
        except OSError as err:
            if err.errno not in READ_ONLY_ERRNOS:
                raise CacheUnavailableError(f"cannot create cache directory {self.root}: {err}") from err
            self._turn_read_only(err)

    def _turn_read_only(self, err: OSError) -> None:
        if not self.read_only:
            self.read_only = True
            self._read_only_reason = f"it is not writable ({err.strerror or err})"
            warn_once_per_root(self.root, "read-only", self._read_only_message())

    def _read_only_message(self) -> str:
        return (
            f"cache directory {self.root} is read-only: {self._read_only_reason}; "
            "compile still works; nothing will be cached here"
        )

    def _check_writable(self) -> None:
        if self.read_only:
            raise CacheReadOnlyError(self._read_only_message())

    def _write_error(self, err: OSError, what: str) -> CacheError:
        """The CacheError to raise (``from err``) for a failed write of ``what``."""
        if err.errno in READ_ONLY_ERRNOS:
            self._turn_read_only(err)
            return CacheReadOnlyError(self._read_only_message())
        if err.errno in FULL_ERRNOS:
            return CacheUnavailableError(f"no space left to write {what} under {self.root} ({err.strerror})")
        return CacheUnavailableError(f"could not write {what} under {self.root}: {err}")

    def _write_atomic(self, path: Path, data: bytes, *, fsync: bool = True) -> None:
        """Write ``data`` to ``path`` (below the root) via ``<name>.<uuid>.incomplete`` + fsync + rename, in its
        directory opened without following a link (:mod:`cache_backends.local.beneath`: missing directories are
        made, a link in a directory's place replaced); the rename replaces whatever was under the name, a link
        itself, never what it names.

        Raises:
            OSError: as raised by the file system; no file is left under ``path``'s name or the temp name.
        """
        tmp = f"{path.name}.{uuid.uuid4().hex}.incomplete"
        with beneath.directory(self.root, path.parent, create=True) as parent:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                         0o666, dir_fd=parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    if fsync:
                        os.fsync(f.fileno())
                os.replace(tmp, path.name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=parent)
                raise

    def _remove_unless(self, path: Path, changed: Callable[[os.stat_result], bool]) -> bool:
        """Remove ``path`` unless ``changed(stat)`` says the file under that name is no longer the one planned.

        The file is first renamed into ``tmp/`` (atomic), then checked; a changed file is put back unless a newer
        one took its name meanwhile.  Both directories are opened without following a link
        (:mod:`cache_backends.local.beneath`), and a link under ``path`` is judged and moved itself.  Returns True
        if a file was removed.  Raises OSError from the rename (other than the file being gone already), or
        NotRegularFileError when a link stands where a directory of ``path`` belongs.
        """
        aside = f"{path.name}.{uuid.uuid4().hex}.removing"
        try:
            with beneath.directory(self.root, path.parent) as src, \
                    beneath.directory(self.root, self._tmp_dir, create=True) as tmp:
                os.rename(path.name, aside, src_dir_fd=src, dst_dir_fd=tmp)
                try:  # the name's own file: a symlink is judged, not what it names
                    keep = changed(os.stat(aside, dir_fd=tmp, follow_symlinks=False))
                except OSError:
                    keep = True
                if keep:
                    try:
                        os.link(aside, path.name, src_dir_fd=tmp, dst_dir_fd=src, follow_symlinks=False)
                    except FileExistsError:
                        pass  # a newer file took the name: it stays
                    except OSError:  # no hard links here: move it back, unless the name was taken meanwhile
                        try:
                            os.stat(path.name, dir_fd=src, follow_symlinks=False)
                        except FileNotFoundError:
                            with contextlib.suppress(OSError):
                                os.rename(aside, path.name, src_dir_fd=tmp, dst_dir_fd=src)
                        except OSError:
                            pass
                with contextlib.suppress(OSError):
                    os.unlink(aside, dir_fd=tmp)
                return not keep
        except FileNotFoundError:  # already gone (or its directory is)
            return False

    def _remove_ref_naming(self, path: Path, digest: str) -> bool:
        """Remove ref file ``path`` if it names ``digest`` and is still the file read (same inode: a writer
        replaces a ref by a rename).  Returns True if removed.  Raises OSError as :meth:`_remove_unless`."""
        try:
            with beneath.open_file(self.root, path, "cache ref") as f:
                st = os.fstat(f.fileno())
                named = f.read(MAX_REF_BYTES).decode("ascii", "replace").strip()
        except (FileNotFoundError, NotRegularFileError):
            return False
        if named != digest:
            return False
        return self._remove_unless(path, lambda s: (s.st_dev, s.st_ino) != (st.st_dev, st.st_ino))

    def _drop_bad_blob(self, digest: str, path: Path, st: os.stat_result | None, why: str) -> None:
        action = "left in place (read-only cache)" if self.read_only else "dropped"
        log.warning("cache blob %s under %s is corrupt (%s); %s, treated as a miss", digest, self.root, why, action)
        if self.read_only:
            return
        ident = drop_ident(self.root, path, st)
        try:
            self._remove_unless(path, lambda s: ident is not None and (s.st_dev, s.st_ino) != ident)
        except OSError as err:
            log.warning("could not remove corrupt cache blob %s: %s", path, err)

    def _ref_files(self) -> list[tuple[str, str, os.stat_result]]:
        """``[(key, text, stat)]`` of every ref file named by a key, sorted by key, garbled texts included (a ref
        that is not a regular file is listed with the text ``""``, unread; at most 256 bytes of a ref are read).

        Raises:
            CacheUnavailableError: ``ref/`` cannot be listed or a ref cannot be read.
        """
        try:
            with beneath.directory(self.root, self._ref_dir) as refs:
                return self._read_ref_files(refs)
        except FileNotFoundError:
            return []
        except OSError as err:  # a link in ref/'s place too (NotRegularFileError): never listed through it
            raise CacheUnavailableError(f"could not list refs under {self.root}: {err}") from err

    def _read_ref_files(self, refs: int) -> list[tuple[str, str, os.stat_result]]:
        """:meth:`_ref_files` of the open ``ref/`` directory ``refs``."""
        with os.scandir(refs) as it:
            names = sorted(e.name for e in it if HEX64.match(e.name))
        out = []
        for name in names:
            path = self._ref_dir / name
            try:
                with beneath.open_in(refs, path, "cache ref") as f:
                    st = os.fstat(f.fileno())
                    text = f.read(MAX_REF_BYTES).decode("ascii", "replace").strip()
            except FileNotFoundError:
                continue
            except NotRegularFileError:  # a link, a FIFO...: listed as a garbled ref (verify drops it), never read
                try:
                    st, text = os.stat(name, dir_fd=refs, follow_symlinks=False), ""
                except OSError:
                    continue
            except OSError as err:
                raise CacheUnavailableError(f"could not read ref {name} under {self.root}: {err}") from err
            out.append((name, text, st))
        return out

    def _scan_blobs(self) -> tuple[dict[str, tuple[Path, os.stat_result]], list[Path]]:
        """``({digest: (path, stat)}, [temp files])`` for everything under ``blob/``."""
        blobs: dict[str, tuple[Path, os.stat_result]] = {}
        temps: list[Path] = []
        try:
            with beneath.directory(self.root, self._blob_dir) as top, os.scandir(top) as it:
                fans = [e.name for e in it if _HEX2.match(e.name) and e.is_dir(follow_symlinks=False)]
                for fan in fans:
                    try:
                        below = os.open(fan, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
                    except (FileNotFoundError, NotADirectoryError):  # gone, or replaced by a link: never listed
                        continue
                    try:
                        self._scan_fan(below, self._blob_dir / fan, blobs, temps)
                    finally:
                        os.close(below)
        except FileNotFoundError:
            return blobs, temps
        except OSError as err:  # a link in blob/'s place too (NotRegularFileError): never listed through it
            raise CacheUnavailableError(f"could not list blobs under {self.root}: {err}") from err
        return blobs, temps

    @staticmethod
    def _scan_fan(fd: int, where: Path, blobs: dict[str, tuple[Path, os.stat_result]], temps: list[Path]) -> None:
        """Add the blobs and temp files of the open fan-out directory ``fd`` (``where``) to ``blobs`` and ``temps``
        (each file's own stat: a link is listed as itself)."""
        with os.scandir(fd) as it:
            for entry in it:
                try:
                    if _HEX62.match(entry.name):
                        blobs[where.name + entry.name] = (where / entry.name, entry.stat(follow_symlinks=False))
                    elif entry.name.endswith(".incomplete"):
                        temps.append(where / entry.name)
                except FileNotFoundError:
                    continue

    def _scan_refs(self) -> list[tuple[str, str, os.stat_result]]:
        """``[(key, digest, stat)]`` of every well-formed ref file now on disk."""
        return [r for r in self._ref_files() if HEX64.match(r[1])]
