"""Writing, removing and scanning files in a local cache directory (the file side of `LocalCache`).

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
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from cache_backends.base import HEX64
from precompile.errors import CacheError, CacheReadOnlyError, CacheUnavailableError

log = logging.getLogger("precompile.cache")

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



class LocalFilesMixin:
    """Atomic writes, checked removals, the read-only switch and the ref-file scan of a
    :class:`~cache_backends.local.LocalCache` (which provides ``root``, ``read_only``, ``_read_only_reason``,
    ``_tmp_dir`` and ``_ref_dir``)."""

    root: Path
    read_only: bool
    _read_only_reason: str
    _tmp_dir: Path
    _ref_dir: Path

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
            keep = changed(os.stat(quarantine))
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

    def _drop_bad_blob(self, digest: str, path: Path, st: os.stat_result | None, why: str) -> None:
        action = "left in place (read-only cache)" if self.read_only else "dropped"
        log.warning("cache blob %s under %s is corrupt (%s); %s, treated as a miss", digest, self.root, why, action)
        if self.read_only:
            return
        ident = (st.st_dev, st.st_ino) if st is not None else None
        try:
            self._remove_unless(path, lambda s: ident is not None and (s.st_dev, s.st_ino) != ident)
        except OSError as err:
            log.warning("could not remove corrupt cache blob %s: %s", path, err)

    def _ref_files(self) -> list[tuple[str, str, os.stat_result]]:
        """``[(key, text, stat)]`` of every ref file named by a key, sorted by key, garbled texts included.

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
                with open(path, "rb") as f:
                    st = os.fstat(f.fileno())
                    text = f.read(256).decode("ascii", "replace").strip()
            except FileNotFoundError:
                continue
            except OSError as err:
                raise CacheUnavailableError(f"could not read ref {name} under {self.root}: {err}") from err
            out.append((name, text, st))
        return out

    def _scan_refs(self) -> list[tuple[str, str, os.stat_result]]:
        """``[(key, digest, stat)]`` of every well-formed ref file now on disk."""
        return [r for r in self._ref_files() if HEX64.match(r[1])]
