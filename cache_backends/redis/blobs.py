"""Reading the blobs of a Redis cache: heads, then chunks or spread pieces, pipelined and verified.

The key layout, the head format and the bounds on what is read are in :mod:`cache_backends.redis.cache`'s and
:mod:`cache_backends.redis.codec`'s docstrings; writing is :mod:`cache_backends.redis.writes`.  A head or chunk that
is missing, garbled or does not hash right is a miss, counted under ``errors``, and deleted (unless read-only) so
the next writer replaces it; so is a key of another type (a hash, a list...) in a head's or a chunk's place, which a
writer also replaces.  Both head keys of a blob (``P:blob:{<digest>}``, ``P:spread:{<digest>}``) carry its hash
tag, so one pipelined round trip to its node reads both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cache_backends.base import MISS, Bounds, _Miss, blob_bound, check_name
from cache_backends.redis import codec
from cache_backends.redis.codec import ChunkedHead
from cache_backends.redis.failover import current_deadline, retrying
from precompile.errors import InputLimitError

log = logging.getLogger("precompile.cache")

#: Digests whose stored copy a read in this process refused as over its bound: the next store of one rewrites it.
SUSPECT: set[str] = set()


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
    (``over``), the parsed chunked or spread heads (to drop the parts of a damaged blob) and the bytes read
    (compressed)."""

    found: dict[str, bytes] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)
    over: list[str] = field(default_factory=list)
    heads: dict[str, ChunkedHead | None] = field(default_factory=dict)
    nread: int = 0


class BlobsMixin:
    """``get_blob(s)`` and ``has_blob(s)`` of a :class:`~cache_backends.redis.cache.RedisCache` (which provides
    ``client``, ``url``, ``ttl_s``, ``read_only``, the key functions, ``_talk``, ``_queue_read``, ``_drop`` and
    ``_count``)."""

    client: Any
    url: str
    ttl_s: float | None
    read_only: bool

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
        """Read and verify blobs ``unique`` (each at most ``bound[d]`` bytes); see :meth:`get_blobs`.  Both heads of
        every blob in one pipelined round trip (a blob's ``P:blob:`` head, whole or chunked, is read when both
        exist), then its chunks or pieces.  Drops and counts nothing (the caller does).  With ``replica``, every
        head, chunk and piece is read from a random node of its slot (``_queue_read``), faults are logged at debug
        level only (the master decides) and errors trip the replicas' breaker only.

        Raises:
            CacheUnavailableError: Redis cannot be reached, timed out or refused the read.
        """
        read = BlobsRead()
        warn = log.debug if replica else log.warning
        refresh = self.ttl_s is not None and not self.read_only
        drop = "a miss, left in place (read-only cache)" if self.read_only else "dropping it"  # as :meth:`_drop` does
        deadline = current_deadline()
        with self._talk(f"reading {len(unique)} blob(s)", replica=replica):
            pipe = self.client.pipeline(transaction=False)
            for d in unique:
                self._queue_read(pipe, self._head_key(d), codec.head_limit(bound[d]), replica)  # a byte more than may be
                self._queue_read(pipe, self._spread_key(d), codec.CHUNKED_HEAD_BYTES, replica)  # idem
                if refresh:
                    pipe.pexpire(self._head_key(d), int(self.ttl_s * 1000))
                    pipe.pexpire(self._spread_key(d), int(self.ttl_s * 1000))
            replies = execute(pipe)
        step = 4 if refresh else 2
        # GETRANGE answers b"" for a missing key; a key of another type answers WRONG_TYPE (execute)
        pairs = {d: (h or None, s or None) for d, h, s in zip(unique, replies[::step], replies[1::step])}
        parts: list[tuple[str, ChunkedHead]] = []
        for d, (head, spread_head) in pairs.items():
            read.heads[d] = None
            if head is WRONG_TYPE or spread_head is WRONG_TYPE:
                warn("Redis blob %s in %s is a key of another type, not a blob; %s", d[:12], self.url, drop)
                read.bad.append(d)
                continue
            if head is None and spread_head is None:
                continue
            read.nread += len(head or spread_head)
            try:
                if head is None:  # a spread blob
                    parsed = codec.parse_chunked(spread_head, spread=True)
                elif len(head) > codec.head_limit(bound[d]):
                    raise InputLimitError(f"its head holds more than the {codec.head_limit(bound[d])} bytes a blob "
                                          f"of at most {bound[d]} bytes is stored in")
                elif codec.head_kind(head) in (codec.INLINE_ZSTD, codec.INLINE_RAW):
                    data, why = codec.decode_inline(d, head, bound[d])
                    if data is None:
                        warn("Redis blob %s in %s %s; %s", d[:12], self.url, why, drop)
                        read.bad.append(d)
                    else:
                        read.found[d] = data
                    continue
                else:
                    parsed = codec.parse_chunked(head)
                if parsed is None:
                    warn("Redis blob %s in %s has a garbled head; %s", d[:12], self.url, drop)
                    read.bad.append(d)
                    continue
                read.heads[d] = parsed
                codec.check_chunked(parsed, bound[d])
                parts.append((d, parsed))
            except InputLimitError as err:
                read.over.append(self._over_limit(d, err, warn))
        for d, parsed in parts:
            try:
                data, why = codec.read_chunked(d, parsed, lambda indices, limit, d=d, h=parsed: self._fetch_chunks(
                    d, h, indices, limit, refresh, replica=replica, deadline=deadline), bound[d])
            except InputLimitError as err:
                read.over.append(self._over_limit(d, err, warn))
                continue
            if data is None:
                warn("Redis blob %s in %s %s; %s", d[:12], self.url, why, drop)
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

    def _fetch_chunks(self, digest: str, head: ChunkedHead, indices: range, limit: int, refresh: bool, *,
                      replica: bool = False, deadline: float | None = None) -> list[bytes | None]:
        """Chunks (or, for a spread ``head``, pieces) ``indices`` of a blob, each read to at most ``limit`` + 1 bytes
        (GETRANGE: a longer chunk shows as one byte too long, never as its whole length), in one pipelined round trip
        (a cluster's pipeline sends each node its share at once; with a TTL, refreshed in the same trip); a missing
        chunk is None.  With ``replica``, each is read from a random node of its slot.  ``replica`` and ``deadline``
        (of the calling thread's retried call: this runs in a helper thread) are passed to ``_talk``."""
        with self._talk(f"reading blob {digest[:12]}", replica=replica, deadline=deadline):
            pipe = self.client.pipeline(transaction=False)
            for i in indices:
                key = self._part_key(digest, i, head)
                self._queue_read(pipe, key, limit, replica)
                if refresh:
                    pipe.pexpire(key, int(self.ttl_s * 1000))  # type: ignore[operator]
            # a chunk of another type reads as missing: the blob is a miss, and dropped with its chunks
            return [None if c is WRONG_TYPE else (c or None) for c in execute(pipe)[:: 2 if refresh else 1]]

    def has_blob(self, digest: str) -> bool:
        """True if either head of blob ``digest`` exists as a string (not verified; one TYPE each, one round trip): a
        key of another type in its place is no blob.

        Raises:
            ValueError: ``digest`` is not 64 lowercase hex characters.
            CacheUnavailableError: Redis cannot be reached.
        """
        return self.has_blobs([digest])[check_name(digest)]

    @retrying
    def has_blobs(self, digests: list[str]) -> dict[str, bool]:
        """``{digest: exists}`` in one pipelined round trip (TYPE of both heads, or with a TTL PEXPIRE, which
        refreshes what exists), plus one more to refresh the chunks or pieces of the blobs stored in parts, so that a
        hit keeps every part of an artifact alive, not only the parts a load reads.

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
                for key in (self._head_key(d), self._spread_key(d)):
                    if refresh:
                        pipe.pexpire(key, int(self.ttl_s * 1000))  # type: ignore[operator]
                        pipe.getrange(key, 0, codec.CHUNKED_HEAD_BYTES - 1)
                    else:
                        pipe.type(key)
            replies = execute(pipe)
            if not refresh:
                return {d: "string" in (type_name(a), type_name(b)) for d, a, b in zip(unique, replies[::2],
                                                                                      replies[1::2])}
            # a head of another type answers GETRANGE with WRONGTYPE: no blob (its next store replaces it)
            found = {}
            ms = int(self.ttl_s * 1000)  # type: ignore[operator]
            for i, d in enumerate(unique):
                r1, head, r2, spread_head = replies[4 * i:4 * i + 4]
                found[d] = (bool(r1) and head is not WRONG_TYPE) or (bool(r2) and spread_head is not WRONG_TYPE)
                self._each_part(d, self._parsed(head, spread_head), lambda p, k: p.pexpire(k, ms))
        return found
