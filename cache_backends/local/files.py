"""Reading, writing, removing and scanning files in a local cache directory (the file side of `LocalCache`).

Every read opens without blocking and only regular files (:mod:`cache_backends.bounded`), bounded by what its
caller accepts.

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
import stat
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from cache_backends.base import HEX64, MISS, _Miss, decompress_frame, digest_bytes
from cache_backends.bounded import MAX_BLOB_BYTES, MAX_REF_BYTES, frame_bound, open_regular, read_at_most
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

_warned_roots: set[tuple[Path, str]] = set()
_warned_lock = threading.Lock()


def warn_once_per_root(root: Path, kind: str, message: str) -> None:
    """Log a warning about the state of a cache directory once per process (later ones at debug level): callers
    open a new :class:`LocalCache` per URL, and a read-only directory must not warn on every compile."""
    with _warned_lock:
        first = (root, kind) not in _warned_roots
        _warned_roots.add((root, kind))
    log.log(logging.WARNING if first else logging.DEBUG, "%s", message)



def lstat_or_none(path: str | os.PathLike[str]) -> os.stat_result | None:
    """``os.lstat(path)``, or None when it cannot be had (a file found unusable is dropped only if it is still the
    one found: :meth:`LocalFilesMixin._remove_unless`)."""
    try:
        return os.lstat(path)
    except OSError:
        return None


def drop_ident(path: Path, st: os.stat_result | None) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` that the file under ``path`` must still have for a reader that found it unusable (its
    stat ``st``) to drop it; a symlink's own (to ``/dev/zero``, to a file elsewhere: the link is removed, never
    what it names), compared by :meth:`LocalFilesMixin._remove_unless` with ``os.lstat``."""
    link = lstat_or_none(path)
    if link is not None and stat.S_ISLNK(link.st_mode):
        st = link
    return (st.st_dev, st.st_ino) if st is not None else None


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
            with open_regular(path, "cache blob") as f:
                st = os.fstat(f.fileno())
                if st.st_size > frame_bound(max_bytes):
                    raise InputLimitError(f"its file holds {st.st_size} bytes, more than a blob of at most {max_bytes} "
                                          "bytes is stored as")
                raw = read_at_most(f, frame_bound(max_bytes), f"cache blob {digest}", st.st_size)
        except FileNotFoundError:
            return MISS, 0, 0
        except NotRegularFileError as err:
            self._drop_bad_blob(digest, path, lstat_or_none(path), str(err))
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

    @staticmethod
    def _write_atomic(path: Path, data: bytes, *, fsync: bool = True) -> None:
        """Write ``data`` to ``path`` via ``<name>.<uuid>.incomplete`` + fsync + os.replace.

        Raises:
            OSError: as raised by the file system; no file is left under ``path``'s name or the temp name.
        """
        tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.incomplete")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                if fsync:
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _remove_unless(self, path: Path, changed: Callable[[os.stat_result], bool]) -> bool:
        """Remove ``path`` unless ``changed(stat)`` says the file under that name is no longer the one planned.

        The file is first renamed into ``tmp/`` (atomic), then checked; a changed file is put back unless a newer
        one took its name meanwhile.  Returns True if a file was removed.  Raises OSError from the rename (other
        than the file being gone already).
        """
        quarantine = self._tmp_dir / f"{path.name}.{uuid.uuid4().hex}.removing"
        try:
            os.rename(path, quarantine)
        except FileNotFoundError:
            if not path.exists():
                return False  # already gone
            self._tmp_dir.mkdir(parents=True, exist_ok=True)  # tmp/ was missing
            try:
                os.rename(path, quarantine)
            except FileNotFoundError:
                return False
        try:
            keep = changed(os.lstat(quarantine))  # the name's own file: a symlink is judged, not what it names
        except OSError:
            keep = True
        if keep:
            try:
                os.link(quarantine, path)
            except FileExistsError:
                pass
            except OSError:
                if not path.exists():
                    with contextlib.suppress(OSError):
                        os.rename(quarantine, path)
        with contextlib.suppress(OSError):
            os.unlink(quarantine)
        return not keep

    def _remove_ref_naming(self, path: Path, digest: str) -> bool:
        """Remove ref file ``path`` if it names ``digest`` and is still the file read (same inode: a writer
        replaces a ref by a rename).  Returns True if removed.  Raises OSError as :meth:`_remove_unless`."""
        try:
            with open_regular(path, "cache ref") as f:
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
        ident = drop_ident(path, st)
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
            entries = sorted((e.name, e.path) for e in os.scandir(self._ref_dir) if HEX64.match(e.name))
        except FileNotFoundError:
            return []
        except OSError as err:
            raise CacheUnavailableError(f"could not list refs under {self.root}: {err}") from err
        out = []
        for name, path in entries:
            try:
                with open_regular(path, "cache ref") as f:
                    st = os.fstat(f.fileno())
                    text = f.read(256).decode("ascii", "replace").strip()
            except FileNotFoundError:
                continue
            except NotRegularFileError:  # listed as a garbled ref (verify drops it), never read
                st2 = lstat_or_none(path)
                if st2 is None:
                    continue
                st, text = st2, ""
            except OSError as err:
                raise CacheUnavailableError(f"could not read ref {name} under {self.root}: {err}") from err
            out.append((name, text, st))
        return out

    def _scan_refs(self) -> list[tuple[str, str, os.stat_result]]:
        """``[(key, digest, stat)]`` of every well-formed ref file now on disk."""
        return [r for r in self._ref_files() if HEX64.match(r[1])]
