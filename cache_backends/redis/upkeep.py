"""Listing, checking and deleting what a Redis cache stores, for ``precompile verify`` and ``precompile gc``.

The methods of :class:`UpkeepMixin` are part of :class:`cache_backends.redis.cache.RedisCache`, which provides
``_talk``, the key names, ``_fetch_chunks``, ``_each_part``, ``_release`` and ``chunk_bytes``.  Nothing here is
on a load's path.
"""

from __future__ import annotations

import time
from typing import Any

from cache_backends.redis import codec
from cache_backends.base import HEX64, StoredBlob, StoredRef, check_name
from cache_backends.bounded import MAX_BLOB_BYTES, MAX_REF_BYTES
from cache_backends.redis.blobs import WRONG_TYPE, execute
from precompile.errors import InputLimitError


class UpkeepMixin:
    """verify/gc support of :class:`cache_backends.redis.cache.RedisCache`."""

    supports_upkeep = True

    def _scan_keys(self, pattern: str) -> list[str]:
        """Every key matching ``pattern`` (SCAN; on every primary of a cluster), sorted; a name that is not UTF-8
        (never one precompile writes) is left out.  Call inside _talk."""
        if self.cluster:
            names: list[Any] = []
            for node in self.client.get_primaries():
                names.extend(self.client.get_redis_connection(node).scan_iter(match=pattern, count=1000))
        else:
            names = list(self.client.scan_iter(match=pattern, count=1000))
        out = set()
        for n in names:
            try:
                out.add(n.decode() if isinstance(n, bytes) else str(n))
            except UnicodeDecodeError:  # not a name precompile writes (every one is ASCII): planted or foreign
                continue
        return sorted(out)

    @staticmethod
    def _last_used(idle: Any, now: float) -> float | None:
        return now - idle if isinstance(idle, int) else None  # OBJECT IDLETIME fails under an LFU policy

    def list_blobs(self) -> list[StoredBlob]:
        """Every blob head (``P:blob:`` and ``P:spread:``; a blob stored in both layouts is listed once, with both
        sizes): digest, bytes stored (head, plus chunks or pieces), and now minus the head's idle time (Redis's LRU
        clock: a read refreshes it).

        Raises:
            CacheUnavailableError: Redis cannot be reached.
        """
        with self._talk("listing blobs"):
            heads = [(n, False) for n in self._scan_keys(f"{self.prefix}:blob:*") if n.endswith("}")]
            heads += [(n, True) for n in self._scan_keys(f"{self.prefix}:spread:*") if n.endswith("}")]
            pipe = self.client.pipeline(transaction=False)
            for name, _ in heads:
                pipe.strlen(name)
                pipe.getrange(name, 0, codec.CHUNKED_HEAD_BYTES - 1)
                pipe.object("idletime", name)
            replies = pipe.execute(raise_on_error=False) if heads else []
        now = time.time()
        found: dict[str, StoredBlob] = {}
        for i, (name, spread) in enumerate(heads):
            digest = name[name.rindex("{") + 1:-1]
            size, start, idle = replies[3 * i:3 * i + 3]
            if not HEX64.match(digest) or not isinstance(size, int):
                continue
            parts = codec.parse_chunked(start if isinstance(start, bytes) else None, spread=spread)
            if parts is not None:
                size += parts.total
            blob = StoredBlob(digest, size, self._last_used(idle, now))
            other = found.get(digest)
            if other is not None:
                used = [t for t in (other.last_used, blob.last_used) if t is not None]
                blob = StoredBlob(digest, other.stored_bytes + size, max(used) if used else None)
            found[digest] = blob
        return [found[d] for d in sorted(found)]

    def list_refs(self) -> list[StoredRef]:
        """Every ref (garbled ones too) with now minus its idle time (a hit reads it, so this is its LRU clock).

        Raises:
            CacheUnavailableError: Redis cannot be reached.
        """
        with self._talk("listing refs"):
            names = [n for n in self._scan_keys(f"{self.prefix}:ref:*") if HEX64.match(n.rsplit(":", 1)[-1])]
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.getrange(name, 0, MAX_REF_BYTES - 1)
                pipe.object("idletime", name)
            replies = pipe.execute(raise_on_error=False) if names else []
        now = time.time()
        out = []
        for i, name in enumerate(names):
            value, idle = replies[2 * i:2 * i + 2]
            if isinstance(value, bytes) and value:
                out.append(StoredRef(name.rsplit(":", 1)[-1], value.decode("ascii", "replace").strip(),
                                     self._last_used(idle, now)))
        return out

    def check_blob(self, digest: str) -> tuple[int | None, str | None]:
        """Read blob ``digest`` (its ``P:blob:`` head, else its spread one, and the chunks or pieces) and re-hash it
        without dropping anything: ``(uncompressed bytes, None)`` or ``(None, why)``.

        Raises:
            ValueError: ``digest`` is not 64 lowercase hex characters.
            CacheUnavailableError: Redis cannot be reached.
        """
        limit = codec.head_limit(MAX_BLOB_BYTES)
        with self._talk(f"checking blob {check_name(digest)[:12]}"):
            pipe = self.client.pipeline(transaction=False)
            pipe.getrange(self._head_key(digest), 0, limit)
            pipe.getrange(self._spread_key(digest), 0, codec.CHUNKED_HEAD_BYTES)
            head, spread_head = execute(pipe)
        if head is WRONG_TYPE or spread_head is WRONG_TYPE:
            return None, "a key of another type, not a blob"
        if not head and not spread_head:
            return None, "missing"
        try:
            if head and len(head) > limit:
                raise InputLimitError(f"its head is longer than {limit} bytes")
            if head and codec.head_kind(head) in (codec.INLINE_ZSTD, codec.INLINE_RAW):
                data, why = codec.decode_inline(digest, head, MAX_BLOB_BYTES)
            else:
                parts = codec.parse_chunked(head) if head else codec.parse_chunked(spread_head, spread=True)
                if parts is None:
                    return None, "garbled head"
                data, why = codec.read_chunked(digest, parts, lambda indices, n: self._fetch_chunks(
                    digest, parts, indices, n, False), MAX_BLOB_BYTES)
        except InputLimitError as err:
            return None, f"larger than any blob ({err})"
        return (len(data), None) if data is not None else (None, why)

    def drop_blob(self, blob: StoredBlob) -> bool:
        """Delete a blob's heads and their chunks or pieces (Redis cannot tell whether a writer re-put it since it
        was listed).

        Raises:
            CacheReadOnlyError: the cache is read-only.
            CacheUnavailableError: Redis cannot be reached.
        """
        digest = check_name(blob.digest)
        keys = (self._head_key(digest), self._spread_key(digest))
        with self._talk(f"deleting blob {digest[:12]}", write=True):
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.getrange(key, 0, codec.CHUNKED_HEAD_BYTES - 1)
            starts = [s if isinstance(s, bytes) else None for s in execute(pipe)]
            deleted = bool(self.client.delete(*keys))  # one hash tag, one slot
            for start, spread in zip(starts, (False, True)):  # a garbled head names no parts
                self._each_part(digest, codec.parse_chunked(start, spread=spread), lambda pipe, k: pipe.delete(k))
            return deleted

    def drop_ref(self, ref: StoredRef) -> bool:
        """Delete a listed ref if it still names the same digest (compare-and-delete in Lua).

        Raises:
            CacheReadOnlyError: the cache is read-only.
            CacheUnavailableError: Redis cannot be reached.
        """
        rkey = self._ref_key(check_name(ref.key, "artifact key"))
        with self._talk(f"deleting ref {ref.key[:12]}", write=True):
            if not HEX64.match(ref.digest):
                return bool(self.client.delete(rkey))
            return bool(self._release(keys=[rkey], args=[ref.digest]))
