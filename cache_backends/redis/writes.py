"""Writing the blobs of a Redis cache: chunks or pieces first, head last; and deleting or refreshing a blob's parts.

A blob short enough is written whole in its head (``P:blob:{<digest>}``); a longer one, with ``spread`` on (the
default on a cluster), as pieces spread over the slots then its head ``P:spread:{<digest>}``, else as chunks then
its chunked head (``P:blob:{<digest>}``): :mod:`cache_backends.redis.codec`.  A reader never sees a head without its
parts (unless the server evicted some: then the read is a miss, and the parts are dropped).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import zstandard

from cache_backends.base import check_name, digest_bytes
from cache_backends.redis import codec, spread
from cache_backends.redis.blobs import SUSPECT, execute, type_name
from cache_backends.redis.codec import PIPELINE_BYTES, RAW_IF_SAVING_BELOW, ChunkedHead
from cache_backends.redis.failover import retrying
from precompile.errors import CacheError

log = logging.getLogger("precompile.cache")

#: Chunk or piece keys per pipeline when deleting or refreshing a blob's parts.
CHUNK_BATCH = 256


class WritesMixin:
    """``put_blob`` and the upkeep of a blob's parts for a :class:`~cache_backends.redis.cache.RedisCache` (which
    provides ``client``, ``url``, ``ttl_s``, ``chunk_bytes``, ``level``, ``spread``, ``read_only``, the key
    functions, ``_talk`` and ``_count``)."""

    client: Any
    url: str
    ttl_s: float | None
    chunk_bytes: int
    level: int
    read_only: bool
    spread: bool

    def _drop(self, digests: list[str], heads: dict[str, ChunkedHead | None]) -> None:
        """Delete corrupt or partial blobs (both heads, and the chunks or pieces ``heads`` names), best effort; never
        in read-only mode."""
        if self.read_only or not digests:
            return
        try:
            with self._talk("dropping a corrupt blob", write=True):
                pipe = self.client.pipeline(transaction=False)
                for d in digests:
                    pipe.delete(self._head_key(d))
                    pipe.delete(self._spread_key(d))
                pipe.execute()
                for d in digests:
                    self._each_part(d, heads.get(d), lambda p, k: p.delete(k))
        except CacheError as err:
            log.debug("could not drop corrupt blobs from %s: %s", self.url, err)

    def _each_part(self, digest: str, head: ChunkedHead | None, command: Callable[[Any, str], object]) -> None:
        """Run ``command(pipeline, key)`` on the chunks (pieces) ``0..count-1`` that ``head`` names (none when it is
        None), in pipelined batches of :data:`CHUNK_BATCH`, stopping after a batch in which no part existed (the
        command answered 0 for every key: DEL, PEXPIRE), so that a garbled head's count costs at most one batch
        more than the real parts.  Call inside :meth:`_talk`."""
        count = head.count if head is not None else 0
        for start in range(0, count, CHUNK_BATCH):
            pipe = self.client.pipeline(transaction=False)
            for i in range(start, min(count, start + CHUNK_BATCH)):
                command(pipe, self._part_key(digest, i, head))
            if not any(pipe.execute()):
                return

    @staticmethod
    def _parsed(chunked: Any, spread_head: Any) -> ChunkedHead | None:
        """The parsed head of a blob from the first bytes of its two head keys (a chunked head, else a spread one),
        or None for an inline, missing or garbled one."""
        if isinstance(chunked, bytes) and chunked:
            return codec.parse_chunked(chunked)
        return codec.parse_chunked(spread_head if isinstance(spread_head, bytes) else None, spread=True)

    @retrying
    def put_blob(self, data: bytes, digest: str | None = None) -> str:
        """Store ``data`` zstd-compressed, or raw where zstd saves less than 3% (idempotent); return its digest.

        An existing blob (either head) is not rewritten (with a TTL, its expiry is refreshed, parts too), but for one
        a read in this process refused as over its bound; a key of another type (a hash, a list...) in a head's
        place is replaced, counted under ``errors``.  A frame longer than its head holds (``chunk_size``; with
        ``spread``, 16 KiB) is written as chunks or spread pieces in pipelined batches, then its head, so a reader
        never sees a head without its parts (unless the server evicted them: then the read is a miss).  Counts
        ``puts`` and ``bytes_written`` for new blobs.

        Raises:
            ValueError: ``digest`` is given and does not match ``data``.
            CacheReadOnlyError: the cache is read-only, or its user may not write.
            CacheUnavailableError: Redis cannot be reached, timed out, or refused the write (e.g. OOM).
        """
        actual = digest_bytes(data)
        if digest is not None and check_name(digest) != actual:
            raise ValueError(f"put_blob: digest {digest} given, but the data hashes to {actual}")
        keys = (self._head_key(actual), self._spread_key(actual))
        with self._talk(f"writing blob {actual[:12]}", write=True):
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.type(key)
                if self.ttl_s is not None:  # refresh an existing blob's TTL in the same round trip
                    pipe.pexpire(key, int(self.ttl_s * 1000))
            kinds = [type_name(k) for k in execute(pipe)[:: 1 if self.ttl_s is None else 2]]
            if "string" in kinds and actual not in SUSPECT:
                if self.ttl_s is not None:
                    self._refresh_parts(actual)
                return actual
            SUSPECT.discard(actual)  # refused as over its bound by a read here: rewritten below
            for key, kind in zip(keys, kinds):
                if kind not in ("none", "string"):  # planted or left by something else: every read would miss
                    log.warning("Redis blob %s in %s is a key of type %s, not a blob; replacing it", actual[:12],
                                self.url, kind[:20])
                    self._count(errors=1)
            if any(kind != "none" for kind in kinds):  # a rewrite: no older copy may stay in the reader's way
                self.client.delete(*keys)  # one hash tag, one slot
            written = self._write(actual, data)
        self._count(puts=1, bytes_written=written)
        return actual

    def _write(self, digest: str, data: bytes) -> int:
        """Write blob ``digest`` in the layout its length and ``spread`` call for; its stored bytes.  Call inside
        :meth:`_talk`."""
        threads = -1 if len(data) > (8 << 20) else 0
        frame = zstandard.ZstdCompressor(level=self.level, threads=threads).compress(bytes(data))
        raw = len(frame) > len(data) * (1 - RAW_IF_SAVING_BELOW)
        if raw:
            frame = bytes(data)
        px = int(self.ttl_s * 1000) if self.ttl_s is not None else None
        inline = min(self.chunk_bytes, codec.SPREAD_MIN_BYTES) if self.spread else self.chunk_bytes
        if len(frame) <= inline:
            self.client.set(self._head_key(digest), codec.inline_head(frame, raw), px=px)
            return len(frame)
        view = memoryview(frame)
        if self.spread:
            count = spread.piece_count(len(frame), self.chunk_bytes)
            bounds = spread.piece_bounds(len(frame), count)
            head = ChunkedHead(count, len(frame), raw, spread=True)
        else:
            count = -(-len(frame) // self.chunk_bytes)
            bounds = [(i * self.chunk_bytes, min(len(frame), (i + 1) * self.chunk_bytes)) for i in range(count)]
            head = ChunkedHead(count, len(frame), raw)
        per_batch = max(1, PIPELINE_BYTES // self.chunk_bytes)
        for start in range(0, count, per_batch):
            pipe = self.client.pipeline(transaction=False)  # a cluster's pipeline sends each node its share
            for i in range(start, min(count, start + per_batch)):
                pipe.set(self._part_key(digest, i, head), bytes(view[bounds[i][0]:bounds[i][1]]), px=px)
            pipe.execute()
        if head.spread:
            self.client.set(self._spread_key(digest), codec.spread_head(count, len(frame), raw), px=px)
        else:
            self.client.set(self._head_key(digest), codec.chunked_head(count, len(frame), raw), px=px)
        return len(frame)

    def _refresh_parts(self, digest: str) -> None:
        """Refresh the TTL of a stored blob's chunks or pieces (its heads were refreshed by the caller).  Call
        inside :meth:`_talk`."""
        pipe = self.client.pipeline(transaction=False)
        pipe.getrange(self._head_key(digest), 0, codec.CHUNKED_HEAD_BYTES - 1)  # a count, never a whole blob
        pipe.getrange(self._spread_key(digest), 0, codec.CHUNKED_HEAD_BYTES - 1)
        chunked, spread_head = execute(pipe)
        ms = int(self.ttl_s * 1000)  # type: ignore[operator]
        self._each_part(digest, self._parsed(chunked, spread_head), lambda p, k: p.pexpire(k, ms))
