"""Size, eviction, fsck, and the listing/checking/deleting that ``precompile verify`` and ``gc`` use, for
:class:`cache_backends.local.cache.LocalCache` (which provides the paths, the locks, the counters and the atomic
remove helpers).  Plan-then-execute everywhere: refs go first, blobs only when no ref on disk keeps them alive
and they are older than the grace period, so a crash never leaves a ref pointing at nothing.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import filelock

from cache_backends.base import HEX64, MISS, StoredBlob, StoredRef, check_name, decompress_frame, digest_bytes
from cache_backends.bounded import MAX_BLOB_BYTES, MAX_MANIFEST_BYTES, frame_bound, loads_json
from cache_backends.local import beneath
from cache_backends.local.heal import lock_file
from precompile.errors import CacheUnavailableError, InputLimitError, NotRegularFileError

log = logging.getLogger("precompile.cache")


#: Eviction brings the blobs of live refs down to this fraction of ``max_bytes``.
EVICT_TARGET_FRACTION = 0.9
#: Temp files (``*.incomplete``, ``tmp/*``) older than this many seconds belong to a dead writer and are removed.
STALE_TEMP_S = 3600.0
#: Seconds between two full scans of blob/ to decide whether to evict (own writes are added in between).
SIZE_RESCAN_S = 10.0


def manifest_blob_digests(manifest: bytes) -> list[str]:
    """Digests a manifest keeps alive: the keys of its top-level ``"blobs"`` object, plus (conservatively) every
    other 64-hex string found anywhere in the JSON, plus the manifest's own digest.

    Keeping a blob that is not really referenced only costs space; dropping one that is breaks an artifact, so
    the scan errs on the side of keeping.  Replace :attr:`LocalCache.referenced_digests` for another schema.

    Raises:
        ValueError: ``manifest`` is not UTF-8 JSON, or is longer than
            :data:`~cache_backends.bounded.MAX_MANIFEST_BYTES` or deeper than
            :data:`~cache_backends.bounded.MAX_JSON_DEPTH` (``InputLimitError``); the evictor then keeps only the
            manifest itself.
    """
    doc = loads_json(manifest, MAX_MANIFEST_BYTES, "cache manifest")
    found: list[str] = [digest_bytes(manifest)]
    if isinstance(doc, dict) and isinstance(doc.get("blobs"), dict):
        found.extend(d for d in doc["blobs"] if isinstance(d, str))
    stack: list[object] = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for k, v in item.items():
                if isinstance(k, str) and HEX64.match(k):
                    found.append(k)
                stack.append(v)
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and HEX64.match(item):
            found.append(item)
    return found


class LocalUpkeepMixin:
    """Eviction and upkeep of :class:`cache_backends.local.cache.LocalCache`."""

    def size_bytes(self) -> int:
        """Total size in bytes of the blob files (compressed, as stored; temp files excluded).

        Raises:
            CacheUnavailableError: ``blob/`` cannot be listed.
        """
        blobs, _ = self._scan_blobs()
        return sum(st.st_size for _, st in blobs.values())

    def _stale_temp_files(self, blob_temps: list[Path]) -> list[Path]:
        """Temp files of dead writers: ``*.incomplete`` under blob/ and ref/, anything in tmp/, older than
        ``STALE_TEMP_S`` seconds."""
        candidates = list(blob_temps)
        for d, only_incomplete in ((self._ref_dir, True), (self._tmp_dir, False)):
            with contextlib.suppress(OSError), beneath.directory(self.root, d) as fd, os.scandir(fd) as it:
                candidates += [d / e.name for e in it if not only_incomplete or e.name.endswith(".incomplete")]
        now = time.time()
        stale = []
        for path in candidates:
            with contextlib.suppress(OSError):
                if now - beneath.lstat(self.root, path).st_mtime > STALE_TEMP_S:
                    stale.append(path)
        return stale

    def _maybe_evict(self) -> None:
        now = time.monotonic()
        if self._size_estimate is None or now - self._size_scanned_at > SIZE_RESCAN_S or (
            self._size_estimate > self.max_bytes
        ):
            self._size_estimate = self.size_bytes()
            self._size_scanned_at = now
            if self._size_estimate > self.max_bytes:
                self.evict()
                self._size_estimate = self.size_bytes()
                self._size_scanned_at = time.monotonic()

    def _referenced_fn(self) -> Callable[[bytes], Iterable[str]]:
        fn = inspect.getattr_static(self, "referenced_digests")
        if isinstance(fn, (staticmethod, classmethod)):
            fn = fn.__get__(None, type(self))
        return fn

    def _manifest_refs(self, manifest_digest: str, memo: dict[str, frozenset[str]]) -> frozenset[str]:
        """Digests the manifest ``manifest_digest`` keeps alive (always including itself).

        Raises:
            CacheUnavailableError: the manifest exists but cannot be read (eviction then deletes no blob).
        """
        found = memo.get(manifest_digest)
        if found is not None:
            return found
        data, nread, nerr = self._read_blob(manifest_digest, MAX_MANIFEST_BYTES)
        self._count(bytes_read=nread, errors=nerr)
        names = {manifest_digest}
        if data is not MISS:
            try:
                names.update(d for d in self._referenced_fn()(data) if isinstance(d, str) and HEX64.match(d))
            except Exception as err:
                log.warning(
                    "cache manifest %s does not parse (%s); eviction keeps only the manifest", manifest_digest, err
                )
        memo[manifest_digest] = found = frozenset(names)
        return found

    def evict(self, max_bytes: int | None = None) -> dict[str, object]:
        """Drop least recently used refs until the blobs the remaining refs keep alive total at most
        ``EVICT_TARGET_FRACTION * max_bytes`` bytes, then delete every blob no remaining ref keeps alive and
        older than ``grace_s`` seconds.  The newest ref is never dropped.  Refs go first, blobs last; a ref read
        or replaced while eviction runs is kept.  Counts ``evictions`` (refs dropped).

        Runs under ``locks/evict.lock`` without waiting: if another process is evicting, returns at once with
        ``skipped=True``.

        Returns:
            ``{"skipped", "refs_dropped", "blobs_deleted", "bytes_freed", "bytes_stored"}`` (bytes compressed).

        Raises:
            CacheReadOnlyError: the cache is read-only.
            CacheUnavailableError: the directory cannot be listed or a manifest cannot be read.
        """
        self._check_writable()
        cap = self.max_bytes if max_bytes is None else int(max_bytes)
        lock = filelock.FileLock(lock_file(self.root, self._lock_dir / "evict.lock"), timeout=0)
        try:
            lock.acquire()
        except filelock.Timeout:
            log.debug("another process is evicting from %s; skipped", self.root)
            return {"skipped": True, "refs_dropped": 0, "blobs_deleted": 0, "bytes_freed": 0, "bytes_stored": None}
        except OSError as err:
            raise self._write_error(err, "the eviction lock") from err
        try:
            return self._evict_locked(cap)
        finally:
            lock.release()

    def _evict_locked(self, cap: int) -> dict[str, object]:
        blobs, temps = self._scan_blobs()
        size = {d: st.st_size for d, (_, st) in blobs.items()}
        memo: dict[str, frozenset[str]] = {}
        # ---- plan: which refs to drop (oldest first) so that the live set fits the target
        refs = sorted(self._scan_refs(), key=lambda r: (r[2].st_mtime_ns, r[0]))
        keeps = {key: self._manifest_refs(digest, memo) for key, digest, _ in refs}
        count: Counter[str] = Counter(d for names in keeps.values() for d in names if d in size)
        live = sum(size[d] for d in count)
        target = int(cap * EVICT_TARGET_FRACTION)
        drop: list[tuple[str, os.stat_result]] = []
        for key, _, st in refs[:-1]:
            if live <= target:
                break
            drop.append((key, st))
            for d in keeps[key]:
                if d in count:
                    count[d] -= 1
                    if count[d] == 0:
                        del count[d]
                        live -= size[d]
        if live > target and refs:
            log.warning(
                "cache %s: the newest artifact alone keeps %d bytes, above %d (max_bytes %d)",
                self.root, live, target, cap,
            )
        # ---- execute: refs first (unless read or replaced since the plan)
        dropped = 0
        for key, st in drop:
            planned = (st.st_ino, st.st_mtime_ns)
            if self._remove_unless(self._ref_path(key), lambda s, p=planned: (s.st_ino, s.st_mtime_ns) != p):
                dropped += 1
        # ---- then blobs that no ref on disk *now* keeps alive, older than the grace period
        alive: set[str] = set()
        for _, digest, _ in self._scan_refs():
            alive |= self._manifest_refs(digest, memo)
        deleted = freed = 0
        for digest, (path, st) in blobs.items():
            if digest in alive or time.time() - st.st_mtime < self.grace_s:
                continue
            if self._remove_unless(path, lambda s: time.time() - s.st_mtime < self.grace_s):
                deleted += 1
                freed += st.st_size
        for tmp in self._stale_temp_files(temps):
            with contextlib.suppress(OSError):
                beneath.unlink(self.root, tmp)
        self._count(evictions=dropped)
        stored = sum(size.values()) - freed
        if dropped or deleted:
            log.info(
                "cache %s: evicted %d artifacts, deleted %d blobs (%d bytes); %d bytes stored, cap %d",
                self.root, dropped, deleted, freed, stored, cap,
            )
        return {"skipped": False, "refs_dropped": dropped, "blobs_deleted": deleted, "bytes_freed": freed,
                "bytes_stored": stored}

    def verify(self, fix: bool = False) -> dict[str, object]:
        """fsck: re-hash every blob and check that every ref's manifest exists.

        With ``fix=True`` bad blobs, refs whose manifest is missing or bad, and temp files older than
        ``STALE_TEMP_S`` seconds are removed.  Blobs that are merely unreferenced are left to eviction.

        Returns:
            ``{"ok", "blobs_checked", "bytes_checked", "bad_blobs", "dangling_refs", "stale_temp_files",
            "removed"}``: ``bad_blobs`` and ``dangling_refs`` are lists of digests / keys; ``bytes_checked`` is
            uncompressed bytes.

        Raises:
            CacheReadOnlyError: ``fix=True`` on a read-only cache.
            CacheUnavailableError: the directory cannot be listed or a file cannot be read.
        """
        if fix:
            self._check_writable()
        blobs, temps = self._scan_blobs()
        bad: list[str] = []
        checked = nbytes = 0
        for digest, (path, st) in sorted(blobs.items()):
            try:
                size, _ = self._check_file(digest, path)
            except FileNotFoundError:
                continue
            checked += 1
            if size is None:
                bad.append(digest)
            else:
                nbytes += size
        bad_set = set(bad)
        dangling: dict[str, os.stat_result] = {}
        for key, digest, st in self._scan_refs():
            # a manifest written after the blob scan (a concurrent writer) is not missing: look again
            if digest in bad_set or (digest not in blobs and not self.has_blob(digest)):
                dangling[key] = st
        stale = [str(p) for p in self._stale_temp_files(temps)]
        removed = 0
        if fix:
            for digest in bad:
                path, st = blobs[digest]
                ident = (st.st_dev, st.st_ino)
                with contextlib.suppress(OSError):
                    removed += self._remove_unless(path, lambda s, i=ident: (s.st_dev, s.st_ino) != i)
            for key, st in dangling.items():
                planned = (st.st_ino, st.st_mtime_ns)
                replaced = lambda s, p=planned: (s.st_ino, s.st_mtime_ns) != p  # noqa: E731
                with contextlib.suppress(OSError):  # a ref replaced since the scan stays
                    removed += self._remove_unless(self._ref_path(key), replaced)
            for tmp in stale:
                with contextlib.suppress(OSError):
                    beneath.unlink(self.root, Path(tmp))
                    removed += 1
        if bad or dangling:
            log.warning(
                "cache %s: %d bad blobs, %d refs without a manifest%s",
                self.root, len(bad), len(dangling), " (removed)" if fix else "",
            )
        return {"ok": not bad and not dangling, "blobs_checked": checked, "bytes_checked": nbytes,
                "bad_blobs": bad, "dangling_refs": sorted(dangling), "stale_temp_files": stale, "removed": removed}

    # ------------------------------------------------------------------------- upkeep (precompile verify, gc)
    supports_upkeep = True

    def list_blobs(self) -> list[StoredBlob]:
        """Every blob file: digest, compressed bytes on disk, mtime (last written or re-put).

        Raises:
            CacheUnavailableError: ``blob/`` cannot be listed.
        """
        blobs, _ = self._scan_blobs()
        return [StoredBlob(d, st.st_size, st.st_mtime) for d, (_, st) in sorted(blobs.items())]

    def list_refs(self) -> list[StoredRef]:
        """Every ref file named by a key, garbled ones included; ``last_used`` is its mtime (the LRU clock).

        Raises:
            CacheUnavailableError: ``ref/`` cannot be listed.
        """
        return [StoredRef(key, text, st.st_mtime) for key, text, st in self._ref_files()]

    def check_blob(self, digest: str) -> tuple[int | None, str | None]:
        """Re-hash blob ``digest`` without dropping it: ``(uncompressed bytes, None)`` or ``(None, why)``.

        Raises:
            ValueError: ``digest`` is not 64 lowercase hex characters.
            CacheUnavailableError: the file exists but cannot be read.
        """
        try:
            return self._check_file(digest, self._blob_path(check_name(digest)))
        except FileNotFoundError:
            return None, "missing"

    def _check_file(self, digest: str, path: Path) -> tuple[int | None, str | None]:
        """``(uncompressed bytes, None)`` or ``(None, why)`` for the blob file ``path``: read bounded (a FIFO, a
        device or a directory is bad without being read; nothing over :data:`MAX_BLOB_BYTES` is allocated).

        Raises:
            FileNotFoundError: it is gone.
            CacheUnavailableError: it exists but cannot be read.
        """
        try:
            raw = beneath.read_file(self.root, path, frame_bound(MAX_BLOB_BYTES), "cache blob")
            data = decompress_frame(raw)
        except NotRegularFileError as err:
            return None, f"not a regular file ({err})"
        except InputLimitError as err:
            return None, f"larger than any blob ({err})"
        except FileNotFoundError:
            raise
        except OSError as err:
            raise CacheUnavailableError(f"could not read blob {digest} under {self.root}: {err}") from err
        except ValueError as err:
            return None, f"does not decompress ({err})"
        if digest_bytes(data) != digest:
            return None, "content does not hash to its name"
        return len(data), None

    def drop_blob(self, blob: StoredBlob) -> bool:
        """Delete a listed blob unless its mtime changed since (``put_blob`` refreshed it: a writer uses it).

        Raises:
            CacheReadOnlyError: the cache is read-only.
            CacheUnavailableError: the file could not be moved away.
        """
        return self._drop_listed(self._blob_path(blob.digest), blob.last_used, f"blob {blob.digest}")

    def drop_ref(self, ref: StoredRef) -> bool:
        """Delete a listed ref unless it was read (a hit refreshes its mtime) or replaced since.

        Raises:
            CacheReadOnlyError: the cache is read-only.
            CacheUnavailableError: the file could not be moved away.
        """
        return self._drop_listed(self._ref_path(check_name(ref.key, "artifact key")), ref.last_used, f"ref {ref.key}")

    def _drop_listed(self, path: Path, last_used: float, what: str) -> bool:
        self._check_writable()
        try:
            return self._remove_unless(path, lambda s: s.st_mtime != last_used)
        except OSError as err:
            raise self._write_error(err, what) from err
