"""A local cache in front of a remote one (a directory in front of Redis): one cache to the artifact layer.

Opened from a list of URLs, or one string with the URLs separated by ``|`` (first is the near tier)::

    open_cache("file:///var/cache/precompile|redis://cache:6379/0?ttl=604800")

- Reads go to the local tier first; a local miss reads the remote and backfills the local tier, once per host: the
  processes of a host that miss the same blob take a lock in the local directory, and the one that holds it first
  fetches while the others wait, then read its copy (:mod:`cache_backends.local.fetch`).  A ref found
  only remotely is backfilled with every blob its manifest names, then the local ref is written, so the local
  tier alone can serve the artifact later (when the remote is down, say).
- Writes go to both (write-through): local first, then remote.
- The remote is optional to every call: when it is down, slow, denies access or returns garbage, the call is
  served by the local tier alone, the failure is logged once (then at debug level) and counted under
  ``remote_errors``; a remote that holds garbage only ever costs a miss, since every blob is verified.  When the
  local tier cannot answer a blob read or existence check by itself and the remote fails, the call raises
  :class:`CacheUnavailableError` rather than report the blobs missing: "could not ask" is never taken for
  "not there", so a transient remote error never gets an intact artifact's ref dropped fleet-wide.
- With verify keys configured (:mod:`precompile.manifest.trust`), a ref found only remotely is backfilled only if its
  manifest's signature checks (the :attr:`TieredCache.refuses` hook precompile's opener sets): an unsigned or badly
  signed entry never reaches the local tier.
- Build leases are the remote's; with the remote down, a build is a plain local build.  With a read-only remote
  (serving workers) a miss waits while another worker holds the lease, and builds locally otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from cache_backends.base import HEX64, MISS, Bounds, Cache, _Miss, blob_bound, digest_bytes
from cache_backends.bounded import MAX_BLOB_BYTES, MAX_MANIFEST_BYTES, loads_json
from cache_backends.local.files import SUSPECT
from precompile.errors import CacheError, CacheReadOnlyError, CacheUnavailableError

__all__ = ["TieredCache", "manifest_sizes"]

log = logging.getLogger("precompile.cache")

T = TypeVar("T")


def manifest_sizes(manifest: bytes) -> dict[str, int]:
    """``{digest: size in bytes}`` of the blobs an artifact's manifest names (its ``"blobs"`` object); a size that
    is not a non-negative integer is :data:`~cache_backends.bounded.MAX_BLOB_BYTES` (the format's bound).

    Raises:
        ValueError: ``manifest`` is not JSON with a ``"blobs"`` object of 64-hex names, or is longer than
            :data:`~cache_backends.bounded.MAX_MANIFEST_BYTES` or deeper than the JSON bound (``InputLimitError``).
    """
    doc = loads_json(manifest, MAX_MANIFEST_BYTES, "manifest")
    blobs = doc.get("blobs") if isinstance(doc, dict) else None
    if not isinstance(blobs, dict) or not all(isinstance(d, str) and HEX64.match(d) for d in blobs):
        raise ValueError("not an artifact manifest: no 'blobs' object of digests")
    sizes = {d: info.get("size") if isinstance(info, dict) else None for d, info in blobs.items()}
    return {d: n if type(n) is int and n >= 0 else MAX_BLOB_BYTES for d, n in sizes.items()}


class TieredCache(Cache):
    """``local`` in front of ``remote``; see the module docstring for the policy.

    Args:
        local: the near tier (usually a :class:`~cache_backends.local.cache.LocalCache`).  Its errors are raised as
            usual (the artifact layer turns them into misses).
        remote: the far tier (usually a :class:`~cache_backends.redis.cache.RedisCache`).  Its errors never
            leave this class.
        refuses: the initial :attr:`refuses` hook (default None).

    Attributes:
        refuses: a hook a caller may set: ``refuses(cache, manifest)`` is True when a manifest read from the remote
            (its stored bytes) must not be backfilled into the near tier (this cache as ``cache``); None refuses
            nothing.  precompile's opener sets it to its signature check
            (:func:`precompile.store.opening.refused_by_trust`), so that the backends never import the trust layer.
        remote_errors: remote failures seen by this process (also counted in the local tier's ``remote_errors``).
    """

    def __init__(self, local: Cache, remote: Cache, *, refuses: Callable[[Cache, bytes], bool] | None = None):
        self.local = local
        self.refuses = refuses
        self.remote = remote
        self.url = f"{local.url}|{remote.url}"
        self.read_only = local.read_only and remote.read_only
        self.remote_errors = 0
        self._warned: set[str] = set()
        #: manifests read from the remote whose signature did not check: served once, never backfilled
        self._held: dict[str, bytes] = {}

    # ------------------------------------------------------------------------------------------- plumbing
    def _remote(self, what: str, fn: Callable[[], T], default: T, *, needed: bool = False) -> T:
        """``fn()`` against the remote; on any cache error (or a read-only remote on writes) ``default``, or with
        ``needed`` (the local tier could not answer alone) a :class:`CacheUnavailableError` chained to it."""
        try:
            return fn()
        except CacheError as err:
            self._note_remote_error(what, err)
            if needed:
                raise CacheUnavailableError(f"remote cache {self.remote.url} failed while {what} that the local "
                                            f"cache {self.local.url} lacks: {err}") from err
            return default

    def _note_remote_error(self, what: str, err: CacheError) -> None:
        """Count a remote failure (``remote_errors``) and log it, as a warning the first time per kind."""
        self.remote_errors += 1
        first = type(err).__name__ not in self._warned
        self._warned.add(type(err).__name__)
        log.log(logging.WARNING if first else logging.DEBUG,
                "remote cache %s failed while %s (%s); serving from the local cache %s", self.remote.url, what,
                err, self.local.url)
        try:
            self.local.incr(remote_errors=1)
        except Exception:  # noqa: BLE001 - counting never fails a call
            pass

    def _write_both(self, what: str, write: Callable[[Cache], object]) -> None:
        """``write(local)``, then ``write(remote)`` unless the remote is read-only (its failure logged and counted).

        Raises:
            CacheError: the local write's error, when the remote write did not succeed either.
        """
        local_err: CacheError | None = None
        try:
            write(self.local)
        except CacheError as err:
            local_err = err
        remote_ok = not self.remote.read_only and self._remote(what, lambda: (write(self.remote), True)[1], False)
        if local_err is not None and not remote_ok:
            raise local_err

    def _backfill(self, blobs: dict[str, bytes]) -> None:
        if self.local.read_only:
            return
        for d, data in blobs.items():
            try:
                self.local.put_blob(data, d)
            except CacheError as err:
                log.debug("backfill of blob %s into %s failed: %s", d[:12], self.local.url, err)
                return

    # ------------------------------------------------------------------------------------------------ blobs
    def get_blob(self, digest: str, max_bytes: int | None = None) -> bytes | _Miss:
        """Local bytes, else the remote's (verified) backfilled locally, else :data:`MISS`; bounded by ``max_bytes``
        in both tiers (:meth:`Cache.get_blob`).

        Raises:
            ValueError: ``digest`` is malformed.
            CacheUnavailableError: the local tier cannot be read.
        """
        return self.get_blobs([digest], max_bytes)[digest]

    def get_blobs(self, digests: list[str], max_bytes: Bounds = None) -> dict[str, bytes | _Miss]:
        """Local first; the local misses in one remote ``get_blobs`` (pipelined for Redis), backfilled (except a
        manifest whose signature did not check, see the module docstring).  Both tiers bound each blob by
        ``max_bytes`` (:meth:`Cache.get_blobs`).  The misses are fetched under the local tier's per-host
        :meth:`~Cache.fetch_lock`, after reading the local tier again: of N processes of a host that miss a blob
        together, one fetches it and the others read its copy (counted under ``near_waits``).

        Raises:
            ValueError: a digest is malformed.
            CacheUnavailableError: the local tier cannot be read, or lacks some of the blobs and the remote failed.
        """
        out = self.local.get_blobs(digests, max_bytes)
        for d in [d for d, v in out.items() if v is MISS and d in self._held]:
            held = self._held.pop(d)
            if len(held) <= blob_bound(max_bytes, d):
                out[d] = held
        missing = [d for d, v in out.items() if v is MISS]
        lock = self.local.fetch_lock(missing) if missing else None
        if lock is None:
            if missing:
                out.update(self._fetch(missing, max_bytes))
            return out
        with lock:  # one download per host: whoever holds it fetches, the others then read the near copy
            # what was missed is looked for again under the lock, a blob another process backfilled since the first
            # read included; not one the first read refused as over its bound (SUSPECT): not read twice
            arrived = [d for d, ok in self.local.has_blobs([d for d in missing if d not in SUSPECT]).items() if ok]
            again = self.local.get_blobs(arrived, max_bytes) if arrived else {}
            near = {d: v for d, v in again.items() if v is not MISS}
            if near:
                self.local.incr(near_waits=len(near))
                out.update(near)
            rest = [d for d in missing if d not in near]
            if rest:
                out.update(self._fetch(rest, max_bytes))
        return out

    def _fetch(self, digests: list[str], max_bytes: Bounds) -> dict[str, bytes]:
        """The blobs of ``digests`` the remote has, verified, backfilled into the local tier and counted there
        (``remote_blobs``, ``remote_bytes``: uncompressed bytes this host fetched).

        Raises:
            CacheUnavailableError: the remote failed.
        """
        got = self._remote(f"reading {len(digests)} blob(s)", lambda: self.remote.get_blobs(digests, max_bytes),
                           {}, needed=True)
        found: dict[str, bytes] = {d: v for d, v in got.items() if v is not MISS}  # type: ignore[misc]
        self._backfill(found)
        if found:
            self.local.incr(remote_blobs=len(found), remote_bytes=sum(len(v) for v in found.values()))
        return found

    def has_blob(self, digest: str) -> bool:
        """True if either tier has the blob.

        Raises:
            CacheUnavailableError: the local tier lacks it and the remote failed.
        """
        return self.local.has_blob(digest) or self._remote("checking a blob", lambda: self.remote.has_blob(digest),
                                                          False, needed=True)

    def has_blobs(self, digests: list[str]) -> dict[str, bool]:
        """Local first; the rest in one remote ``has_blobs``.

        Raises:
            CacheUnavailableError: the local tier lacks some and the remote failed.
        """
        out = self.local.has_blobs(digests)
        missing = [d for d, ok in out.items() if not ok]
        if missing:
            out.update(self._remote("checking blobs", lambda: self.remote.has_blobs(missing), {}, needed=True))
        return out

    def put_blob(self, data: bytes, digest: str | None = None) -> str:
        """Write to the local tier, then to the remote (a remote failure is logged and counted, not raised).

        Raises:
            ValueError: ``digest`` does not match ``data``.
            CacheReadOnlyError: both tiers are read-only.
            CacheError: the local tier failed and the remote did too.
        """
        actual = digest_bytes(data)
        if digest is not None and digest != actual:
            raise ValueError(f"put_blob: digest {digest} given, but the data hashes to {actual}")
        self._write_both(f"writing blob {actual[:12]}", lambda c: c.put_blob(data, actual))
        return actual

    # ------------------------------------------------------------------------------------------------- refs
    def get_ref(self, key: str) -> str | _Miss:
        """The local ref, else the remote's; a remote-only ref is backfilled with its manifest's blobs, then the
        local ref is written.

        Raises:
            ValueError: ``key`` is malformed.
            CacheUnavailableError: the local tier cannot be read.
        """
        digest = self.local.get_ref(key)
        if digest is not MISS:
            return digest
        digest = self._remote(f"reading ref {key[:12]}", lambda: self.remote.get_ref(key), MISS)
        if digest is MISS or self.local.read_only:
            return digest
        self._backfill_artifact(key, digest)  # type: ignore[arg-type]
        return digest

    def _backfill_artifact(self, key: str, digest: str) -> None:
        """Copy a remote-only artifact (manifest, every blob it names, then the ref) into the local tier, if its
        manifest's signature checks under the verify keys configured (any, when none are)."""
        try:
            got = self.remote.get_blobs([digest], MAX_MANIFEST_BYTES)
        except CacheError as err:
            self._note_remote_error(f"reading manifest {digest[:12]}", err)
            return
        manifest = got.get(digest, MISS)
        if manifest is MISS:
            return
        try:
            sizes = manifest_sizes(manifest)  # type: ignore[arg-type]
        except ValueError:
            return
        if self.refuses is not None and self.refuses(self, manifest):  # type: ignore[arg-type]
            if len(self._held) >= 16:
                self._held.clear()
            self._held[digest] = manifest  # type: ignore[assignment]
            return  # the load that follows refuses it, counts and logs why
        self._backfill({digest: manifest})  # type: ignore[dict-item]
        try:
            missing = [d for d, ok in self.local.has_blobs(list(sizes)).items() if not ok]
            if missing:
                got = self.get_blobs(missing, sizes)  # each part no larger than the manifest records
                if any(v is MISS for v in got.values()):
                    return  # incomplete remotely: the load that follows finds out and drops the ref
            self.local.set_ref(key, digest)
        except CacheError as err:
            log.debug("backfill of artifact %s into %s failed: %s", key[:12], self.local.url, err)

    def set_ref(self, key: str, digest: str) -> None:
        """Write the ref locally, then remotely (callers wrote the blobs to both first).

        Raises:
            CacheError: the local tier failed and so did the remote.
        """
        self._write_both(f"writing ref {key[:12]}", lambda c: c.set_ref(key, digest))

    def delete_ref(self, key: str, digest: str | None = None) -> bool:
        """Remove ``key`` from both tiers (a broken artifact is broken everywhere); True if either had it.  With
        ``digest``, each tier's ref only if it names that digest: a damaged local entry never deletes the remote
        ref to a good one.

        Raises:
            CacheReadOnlyError: both tiers are read-only (as :meth:`put_blob` and :meth:`set_ref` do).
        """
        if self.read_only:
            raise CacheReadOnlyError(f"cannot delete ref {key[:12]}: both tiers of {self.url} are read-only")
        gone = False
        try:
            gone = self.local.delete_ref(key, digest)
        except CacheError as err:
            log.debug("could not delete ref %s from %s: %s", key[:12], self.local.url, err)
        if not self.remote.read_only:
            gone = self._remote(f"deleting ref {key[:12]}", lambda: self.remote.delete_ref(key, digest), False) or gone
        return gone

    def iter_refs(self) -> Iterator[tuple[str, str]]:
        """Refs of both tiers (local wins where both have a key)."""
        seen: dict[str, str] = dict(self.local.iter_refs())
        yield from seen.items()
        for key, digest in self._remote("listing refs", lambda: list(self.remote.iter_refs()), []):
            if key not in seen:
                yield key, digest

    # ----------------------------------------------------------------------------------------------- leases
    @property
    def supports_leases(self) -> bool:  # type: ignore[override]
        return self.remote.supports_leases  # a read-only remote still shows whose build to wait for

    @property
    def wait_s(self) -> float:  # type: ignore[override]
        return self.remote.wait_s

    @property
    def lease_ttl_s(self) -> float:  # type: ignore[override]
        return self.remote.lease_ttl_s

    def acquire_lease(self, key: str, ttl_s: float | None = None) -> str | None:
        """The remote's lease (see :meth:`Cache.acquire_lease`).

        Raises:
            CacheError: the remote failed (the caller then builds without a lease).
        """
        return self.remote.acquire_lease(key, ttl_s)

    def renew_lease(self, key: str, token: str, ttl_s: float | None = None) -> bool:
        """The remote's renewal; raises the remote's :class:`CacheError`."""
        return self.remote.renew_lease(key, token, ttl_s)

    def release_lease(self, key: str, token: str) -> bool:
        """The remote's release; raises the remote's :class:`CacheError`."""
        return self.remote.release_lease(key, token)

    def lease_held(self, key: str) -> bool:
        """The remote's lease state; raises the remote's :class:`CacheError`."""
        return self.remote.lease_held(key)

    # --------------------------------------------------------------------------------------------- counters
    def incr(self, **counts: int) -> None:
        """Count in both tiers (the remote's are fleet-wide).  Never raises."""
        self.local.incr(**counts)
        self.remote.incr(**counts)

    def counters(self) -> dict[str, int]:
        """The local tier's counters (this machine), plus ``remote_errors``; the fleet's are in :meth:`stats`."""
        return self.local.counters()

    def stats(self) -> dict[str, Any]:
        """This machine's counters and ``hit_rate``, plus ``tiers``: each tier's own :meth:`Cache.stats`."""
        out: dict[str, Any] = super().stats()
        remote: dict[str, Any]
        try:
            remote = self.remote.stats()
        except Exception as err:  # noqa: BLE001 - stats never fail
            remote = {"url": self.remote.url, "error": str(err)}
        out["tiers"] = [self.local.stats(), remote]
        return out

    def close(self) -> None:
        """Close both tiers."""
        self.local.close()
        self.remote.close()
