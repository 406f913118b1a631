"""The blobs of a Redis cache: heads and chunks written chunks first, head last; pipelined, verified reads.

The key layout, the head format and the bounds on what is read are in :mod:`cache_backends.redis.cache`'s and
:mod:`cache_backends.redis.codec`'s docstrings.  A head or chunk that is missing, garbled or does not hash right is
a miss, counted under ``errors``, and deleted (unless read-only) so the next writer replaces it; so is a key of
another type (a hash, a list...) in a head's or a chunk's place, which a writer also replaces.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zstandard

from cache_backends.redis import codec
from cache_backends.base import MISS, Bounds, _Miss, blob_bound, check_name, digest_bytes
from cache_backends.redis.codec import PIPELINE_BYTES, RAW_IF_SAVING_BELOW
from cache_backends.redis.failover import current_deadline, retrying
from precompile.errors import CacheError, InputLimitError

log = logging.getLogger("precompile.cache")

#: Digests whose stored copy a read in this process refused as over its bound: the next store of one rewrites it.
SUSPECT: set[str] = set()

#: Chunk keys per pipeline when deleting or refreshing a blob's chunks.
CHUNK_BATCH = 256


class _WrongType:
    """What a read answers for a key that holds a hash, a list, a set... where a string was written."""

    def __repr__(self) -> str:
        return "WRONG_TYPE"


#: The reply :func:`execute` gives for a command on a key of the wrong type (Redis's WRONGTYPE error).
WRONG_TYPE = _WrongType()


def execute(pipe: Any) -> list[Any]:
    """``pipe.execute()``, where a command on a key of the wrong type (a hash or list planted where a blob, chunk
    or ref was) answers :data:`WRONG_TYPE` instead of failing the whole pipeline, so that the caller treats that
    one key as damaged (a miss, dropped) and the others as usual.  Call inside ``_talk``.

    Raises:
        redis.exceptions.RedisError: any other error (``_talk`` maps it to a ``CacheError``).
    """
    replies = pipe.execute(raise_on_error=False)
    for reply in replies:
        if isinstance(reply, Exception) and not is_wrong_type(reply):
            raise reply
    return [WRONG_TYPE if isinstance(r, Exception) else r for r in replies]


def is_wrong_type(err: BaseException) -> bool:
    """True for Redis's answer to a command on a key holding another type (``WRONGTYPE ...``)."""
    return str(err).startswith("WRONGTYPE")


def type_name(reply: Any) -> str:
    """A TYPE reply as text (``"string"``, ``"none"``, ``"hash"``...)."""
    return reply.decode("ascii", "replace") if isinstance(reply, bytes) else str(reply)


@dataclass
class BlobsRead:
    """What one pass over some blobs found: verified bytes, damaged blobs (``bad``), blobs over their bound
    (``over``), the heads read (to drop the chunks of a damaged blob) and the bytes read (compressed)."""

    found: dict[str, bytes] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)
    over: list[str] = field(default_factory=list)
    heads: dict[str, Any] = field(default_factory=dict)
    nread: int = 0


class BlobsMixin:
    """``get_blob(s)``, ``has_blob(s)``, ``put_blob`` of a :class:`~cache_backends.redis.cache.RedisCache` (which
    provides ``client``, ``url``, ``ttl_s``, ``chunk_bytes``, ``level``, ``read_only``, the key functions, ``_talk``
    and ``_count``)."""

    client: Any
    url: str
    ttl_s: float | None
    chunk_bytes: int
    level: int
    read_only: bool

    def _drop(self, digests: list[str], heads: dict[str, bytes | None]) -> None:
        """Delete corrupt or partial blobs (head and chunks), best effort; never in read-only mode."""
        if self.read_only or not digests:
            return
        try:
            with self._talk("dropping a corrupt blob", write=True):
                pipe = self.client.pipeline(transaction=False)
                for d in digests:
                    pipe.delete(self._head_key(d))
                pipe.execute()
                for d in digests:
                    self._each_chunk(d, self._chunk_count(heads.get(d)) or 0, lambda p, k: p.delete(k))
        except CacheError as err:
            log.debug("could not drop corrupt blobs from %s: %s", self.url, err)

    def _each_chunk(self, digest: str, count: int, command: Callable[[Any, str], object]) -> None:
        """Run ``command(pipeline, chunk key)`` on chunks ``0..count-1`` of a blob, in pipelined batches of
        :data:`CHUNK_BATCH`, stopping after a batch in which no chunk existed (the command answered 0 for every
        key: DEL, PEXPIRE), so that a garbled head's count costs at most one batch more than the real chunks.
        Call inside :meth:`_talk`."""
        for start in range(0, count, CHUNK_BATCH):
            pipe = self.client.pipeline(transaction=False)
            for i in range(start, min(count, start + CHUNK_BATCH)):
                command(pipe, self._chunk_key(digest, i))
            if not any(pipe.execute()):
                return

    @staticmethod
    def _chunk_count(head: bytes | None) -> int | None:
        parsed = codec.parse_chunked(head)
        return None if parsed is None else parsed.count

    def get_blob(self, digest: str, max_bytes: int | None = None) -> bytes | _Miss:
        """Bytes of blob ``digest`` (verified), or :data:`MISS`.  A corrupt or partial copy is dropped, counted
        under ``errors`` and reported as :data:`MISS`; one larger than ``max_bytes`` bytes (uncompressed; default
        and cap :data:`~cache_backends.bounded.MAX_BLOB_BYTES`) is a miss counted under ``errors`` and
        ``over_limit``, refused before it is allocated, and kept until this process
        stores the blob again (then rewritten).

        Raises:
            ValueError: ``digest`` is not 64 lowercase hex characters.
            CacheUnavailableError: Redis cannot be reached, timed out or refused the read.
        """
        return self.get_blobs([digest], max_bytes)[check_name(digest)]

    @retrying
    def get_blobs(self, digests: list[str], max_bytes: Bounds = None) -> dict[str, bytes | _Miss]:
        """``{digest: bytes or MISS}``: heads in one pipelined round trip, then chunks in pipelined batches of
        about :data:`PIPELINE_BYTES`.  With a TTL, every key read is refreshed in the same pipelines.
        Counts ``bytes_read`` (compressed bytes) and ``errors``.

        Each blob is bounded as :meth:`get_blob` by ``max_bytes`` (one bound, or one per digest:
        :data:`~cache_backends.base.Bounds`): a head is read only as far as such a blob's stored form can reach
        (GETRANGE), a chunked head's length is checked before any chunk is read, each chunk is read only as far as
        its head allows, and a frame decompresses as a stream that stops at the bound.

        Raises:
            ValueError: a digest is not 64 lowercase hex characters (checked before anything is read).
            CacheUnavailableError: Redis cannot be reached, timed out or refused the read.
        """
        unique = list(dict.fromkeys(check_name(d) for d in digests))
        out: dict[str, bytes | _Miss] = dict.fromkeys(unique, MISS)
        if not unique:
            return out
        bound = {d: blob_bound(max_bytes, d) for d in unique}
        rest = unique
        if self._replica_reads:  # a cluster's replicas first; the masters for what they lack
            found = self._read_from_replicas(unique, bound)
            out.update(found)
            rest = [d for d in unique if d not in found]
        if rest:
            read = self._read_blobs(rest, bound)
            self._drop(read.bad, read.heads)
            self._count(bytes_read=read.nread, errors=len(read.bad) + len(read.over), over_limit=len(read.over))
            out.update(read.found)
        return out

    def _read_blobs(self, unique: list[str], bound: dict[str, int], replica: bool = False) -> BlobsRead:
        """Read and verify blobs ``unique`` (each at most ``bound[d]`` bytes); see :meth:`get_blobs`.  Drops and
        counts nothing (the caller does).  With ``replica``, every head and chunk is read from a random node of its
        slot (``_queue_read``), faults are logged at debug level only (the master decides) and errors trip the
        replicas' breaker only.

        Raises:
            CacheUnavailableError: Redis cannot be reached, timed out or refused the read.
        """
        read = BlobsRead()
        warn = log.debug if replica else log.warning
        refresh = self.ttl_s is not None and not self.read_only
        deadline = current_deadline()
        with self._talk(f"reading {len(unique)} blob(s)", replica=replica):
            pipe = self.client.pipeline(transaction=False)
            for d in unique:
                self._queue_read(pipe, self._head_key(d), codec.head_limit(bound[d]), replica)  # a byte more than may be
                if refresh:
                    pipe.pexpire(self._head_key(d), int(self.ttl_s * 1000))
            replies = execute(pipe)
        # GETRANGE answers b"" for a missing key; a key of another type answers WRONG_TYPE (execute)
        heads = read.heads = {d: h or None for d, h in zip(unique, replies[:: 2 if refresh else 1])}
        chunked: list[tuple[str, codec.ChunkedHead]] = []
        for d, head in heads.items():
            if head is WRONG_TYPE:
                warn("Redis blob %s in %s is a key of another type, not a blob; dropping it", d[:12], self.url)
                heads[d] = None
                read.bad.append(d)
                continue
            if head is None:
                continue
            read.nread += len(head)
            try:
                if len(head) > codec.head_limit(bound[d]):
                    raise InputLimitError(f"its head holds more than the {codec.head_limit(bound[d])} bytes a blob "
                                          f"of at most {bound[d]} bytes is stored in")
                if codec.head_kind(head) in (codec.INLINE_ZSTD, codec.INLINE_RAW):
                    data, why = codec.decode_inline(d, head, bound[d])
                    if data is None:
                        warn("Redis blob %s in %s %s; dropping it", d[:12], self.url, why)
                        read.bad.append(d)
                    else:
                        read.found[d] = data
                    continue
                parsed = codec.parse_chunked(head)
                if parsed is None:
                    warn("Redis blob %s in %s has a garbled head; dropping it", d[:12], self.url)
                    read.bad.append(d)
                    continue
                codec.check_chunked(parsed, bound[d])
                chunked.append((d, parsed))
            except InputLimitError as err:
                read.over.append(self._over_limit(d, err, warn))
        for d, parsed in chunked:
            try:
                data, why = codec.read_chunked(d, parsed, lambda indices, limit, d=d: self._fetch_chunks(
                    d, indices, limit, refresh, replica=replica, deadline=deadline), bound[d])
            except InputLimitError as err:
                read.over.append(self._over_limit(d, err, warn))
                continue
            if data is None:
                warn("Redis blob %s in %s %s; dropping it", d[:12], self.url, why)
                read.bad.append(d)
            else:
                read.found[d] = data
                read.nread += parsed.total
        return read

    def _over_limit(self, digest: str, err: InputLimitError, warn: Callable[..., None] = log.warning) -> str:
        """A blob larger than its reader accepts: logged, left in place (counted by the caller; the bound may be
        another reader's), and rewritten by this process's next ``put_blob`` of it, so that it heals; returns it."""
        warn("Redis blob %s in %s is refused: %s; treated as a miss and left in place", digest[:12], self.url, err)
        SUSPECT.add(digest)
        return digest

    def _fetch_chunks(self, digest: str, indices: range, limit: int, refresh: bool, *, replica: bool = False,
                      deadline: float | None = None) -> list[bytes | None]:
        """Chunks ``indices`` of a blob, each read to at most ``limit`` + 1 bytes (GETRANGE: a longer chunk shows as
        one byte too long, never as its whole length), in one pipelined round trip (with a TTL, refreshed in the same
        trip); a missing chunk is None.  With ``replica``, each chunk is read from a random node of its slot.
        ``replica`` and ``deadline`` (of the calling thread's retried call: this runs in a helper thread) are passed
        to ``_talk``."""
        with self._talk(f"reading blob {digest[:12]}", replica=replica, deadline=deadline):
            pipe = self.client.pipeline(transaction=False)
            for i in indices:
                self._queue_read(pipe, self._chunk_key(digest, i), limit, replica)
                if refresh:
                    pipe.pexpire(self._chunk_key(digest, i), int(self.ttl_s * 1000))  # type: ignore[operator]
            # a chunk of another type reads as missing: the blob is a miss, and dropped with its chunks
            return [None if c is WRONG_TYPE else (c or None) for c in execute(pipe)[:: 2 if refresh else 1]]

    @retrying
    def has_blob(self, digest: str) -> bool:
        """True if blob ``digest``'s head exists as a string (not verified; one TYPE): a key of another type in its
        place is no blob.

        Raises:
            ValueError: ``digest`` is not 64 lowercase hex characters.
            CacheUnavailableError: Redis cannot be reached.
        """
        with self._talk("checking a blob"):
            return type_name(self.client.type(self._head_key(check_name(digest)))) == "string"

    @retrying
    def has_blobs(self, digests: list[str]) -> dict[str, bool]:
        """``{digest: exists}`` in one pipelined round trip (EXISTS, or with a TTL PEXPIRE, which refreshes what
        exists), plus one more to refresh the chunks of chunked blobs, so that a hit keeps every part of an
        artifact alive, not only the parts a load reads.

        Raises:
            ValueError: a digest is not 64 lowercase hex characters.
            CacheUnavailableError: Redis cannot be reached.
        """
        unique = list(dict.fromkeys(check_name(d) for d in digests))
        if not unique:
            return {}
        refresh = self.ttl_s is not None and not self.read_only
        with self._talk(f"checking {len(unique)} blob(s)"):
            pipe = self.client.pipeline(transaction=False)
            for d in unique:
                if refresh:
                    pipe.pexpire(self._head_key(d), int(self.ttl_s * 1000))  # type: ignore[operator]
                    pipe.getrange(self._head_key(d), 0, codec.CHUNKED_HEAD_BYTES)
                else:
                    pipe.type(self._head_key(d))
            replies = execute(pipe)
            if not refresh:
                return {d: type_name(r) == "string" for d, r in zip(unique, replies)}
            # a head of another type answers GETRANGE with WRONGTYPE: no blob (its next store replaces it)
            found = {d: bool(r) and head is not WRONG_TYPE for d, r, head in zip(unique, replies[::2], replies[1::2])}
            ms = int(self.ttl_s * 1000)  # type: ignore[operator]
            for d, head in zip(unique, replies[1::2]):
                if head is not WRONG_TYPE:
                    self._each_chunk(d, self._chunk_count(head) or 0, lambda p, k: p.pexpire(k, ms))
        return found

    @retrying
    def put_blob(self, data: bytes, digest: str | None = None) -> str:
        """Store ``data`` zstd-compressed, or raw where zstd saves less than 3% (idempotent); return its digest.

        An existing blob is not rewritten (with a TTL, its expiry is refreshed), but for one a read in this process
        refused as over its bound; a key of another type (a hash,
        a list...) in its head's place is replaced, counted under ``errors``.  A frame longer than
        ``chunk_size`` bytes is written as chunks in pipelined batches, then its head, so a reader never sees a
        head without its chunks (unless the server evicted them: then the read is a miss).  Counts ``puts``
        and ``bytes_written`` for new blobs.

        Raises:
            ValueError: ``digest`` is given and does not match ``data``.
            CacheReadOnlyError: the cache is read-only, or its user may not write.
            CacheUnavailableError: Redis cannot be reached, timed out, or refused the write (e.g. OOM).
        """
        actual = digest_bytes(data)
        if digest is not None and check_name(digest) != actual:
            raise ValueError(f"put_blob: digest {digest} given, but the data hashes to {actual}")
        head_key = self._head_key(actual)
        with self._talk(f"writing blob {actual[:12]}", write=True):
            if self.ttl_s is None:
                kind = type_name(self.client.type(head_key))
            else:  # refresh an existing blob's TTL in the same round trip
                pipe = self.client.pipeline(transaction=False)
                pipe.type(head_key)
                pipe.pexpire(head_key, int(self.ttl_s * 1000))
                kind = type_name(execute(pipe)[0])
            if kind == "string" and actual not in SUSPECT:
                if self.ttl_s is not None:
                    self._refresh_chunks(actual)
                return actual
            SUSPECT.discard(actual)  # refused as over its bound by a read here: rewritten below
            if kind not in ("none", "string"):  # planted or left by something else: it would make every read of this blob a miss
                log.warning("Redis blob %s in %s is a key of type %s, not a blob; replacing it", actual[:12],
                            self.url, kind[:20])
                self.client.delete(head_key)
                self._count(errors=1)
            threads = -1 if len(data) > (8 << 20) else 0
            frame = zstandard.ZstdCompressor(level=self.level, threads=threads).compress(bytes(data))
            raw = len(frame) > len(data) * (1 - RAW_IF_SAVING_BELOW)
            if raw:
                frame = bytes(data)
            px = int(self.ttl_s * 1000) if self.ttl_s is not None else None
            if len(frame) <= self.chunk_bytes:
                self.client.set(head_key, codec.inline_head(frame, raw), px=px)
            else:
                view = memoryview(frame)
                count = -(-len(frame) // self.chunk_bytes)
                per_batch = max(1, PIPELINE_BYTES // self.chunk_bytes)
                for start in range(0, count, per_batch):
                    pipe = self.client.pipeline(transaction=False)
                    for i in range(start, min(count, start + per_batch)):
                        chunk = view[i * self.chunk_bytes:(i + 1) * self.chunk_bytes]
                        pipe.set(self._chunk_key(actual, i), bytes(chunk), px=px)
                    pipe.execute()
                self.client.set(head_key, codec.chunked_head(count, len(frame), raw), px=px)
        self._count(puts=1, bytes_written=len(frame))
        return actual

    def _refresh_chunks(self, digest: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.getrange(self._head_key(digest), 0, codec.CHUNKED_HEAD_BYTES - 1)  # a chunk count, never a whole blob
        head = execute(pipe)[0]
        ms = int(self.ttl_s * 1000)  # type: ignore[operator]
        count = self._chunk_count(head if isinstance(head, bytes) else None)
        self._each_chunk(digest, count or 0, lambda p, k: p.pexpire(k, ms))
