"""How a blob is stored in Redis: its head (inline bytes, or a piece count and length) and its pieces.

``P:blob:{<digest>}`` holds ``b"PCB1"`` + a kind byte + a payload:

- ``Z`` / ``R``: the payload is the whole blob, as a zstd frame / the raw bytes;
- ``C`` / ``K`` (the chunked layout: written with ``spread=0``, the default on one server, and by precompile before
  the spread layout; always read): the payload is struct ``<IQ`` (chunk count, stored length in bytes); chunks
  ``P:blob:{<digest>}:<i>`` hold a zstd frame / the raw bytes, each at most ``chunk_size`` long, the last shorter.

``P:spread:{<digest>}`` (the spread layout: ``spread=1``, the default on a cluster) holds ``b"PCB1"`` + ``S`` /
``T`` + struct ``<IQ`` (piece count, stored length): the zstd frame / raw bytes cut into that many pieces, piece
``i`` of ``n`` in ``P:piece:{<tag>}<digest>:<n>:<i>``, each ``i * length // n`` to ``(i + 1) * length // n``, under a
hash tag of its own that spreads the pieces evenly over the cluster's slots (:mod:`cache_backends.redis.spread`).
A version of precompile that predates it never reads ``P:spread:`` keys: to it a spread blob is absent, a clean
miss (docs/format.md, "In a cache").

Raw is used where zstd saves less than :data:`RAW_IF_SAVING_BELOW` of the size (kernel binaries, random data).
Reading verifies everything: a head that does not parse, a chunk that is missing or longer than the head allows,
lengths that disagree, a frame that does not decompress or bytes that do not hash to the digest make the blob a
miss.  Reading is bounded by what the reader accepts (``max_bytes``, uncompressed): a head's stored length is
checked before any chunk is read, every chunk is read at most to the length its head allows, and a frame is
decompressed as a stream that stops at the bound (:class:`~precompile.errors.InputLimitError`).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import zstandard

from cache_backends.base import digest_bytes
from cache_backends.bounded import STEP, frame_bound, inflate
from precompile.errors import InputLimitError

MAGIC = b"PCB1"
HEAD_CHUNKED = struct.Struct("<IQ")
INLINE_ZSTD, INLINE_RAW, CHUNKED_ZSTD, CHUNKED_RAW = b"Z", b"R", b"C", b"K"
SPREAD_ZSTD, SPREAD_RAW = b"S", b"T"
#: Stored frames up to this long stay whole in their head with ``spread=1`` (and up to ``chunk_size``); longer ones
#: are spread in pieces (a small blob in pieces would cost more round trips than its bytes).
SPREAD_MIN_BYTES = 16 << 10
#: Raw (not zstd) where zstd saves less than this fraction of the size.
RAW_IF_SAVING_BELOW = 0.03
#: Bytes of a chunked head (what a GETRANGE of a head must read to learn its chunk count).
CHUNKED_HEAD_BYTES = len(MAGIC) + 1 + HEAD_CHUNKED.size
#: Bytes of chunk data requested per pipeline round trip.  Small enough that fetching the next batch overlaps
#: hashing this one; a loopback round trip costs ~0.1 ms against ~20 ms to move 4 MiB.
PIPELINE_BYTES = 4 << 20
#: Most chunks fetched in one round trip (when the reader's chunk size is small).
MAX_BATCH = 1024


@dataclass(frozen=True)
class ChunkedHead:
    """A chunked or spread blob's head: ``count`` chunks (pieces) holding ``total`` stored bytes, raw or one zstd
    frame; ``spread``: the pieces of the spread layout, else the chunks of the chunked one."""

    count: int
    total: int
    raw: bool
    spread: bool = False


def inline_head(payload: bytes, raw: bool) -> bytes:
    """The head of a blob stored whole: a zstd frame (``raw`` False) or the raw bytes."""
    return MAGIC + (INLINE_RAW if raw else INLINE_ZSTD) + payload


def chunked_head(count: int, total: int, raw: bool) -> bytes:
    """The head of a blob stored as ``count`` chunks holding ``total`` bytes."""
    return MAGIC + (CHUNKED_RAW if raw else CHUNKED_ZSTD) + HEAD_CHUNKED.pack(count, total)


def spread_head(count: int, total: int, raw: bool) -> bytes:
    """The head of a blob stored as ``count`` spread pieces holding ``total`` bytes (at ``P:spread:{<digest>}``)."""
    return MAGIC + (SPREAD_RAW if raw else SPREAD_ZSTD) + HEAD_CHUNKED.pack(count, total)


def head_kind(head: bytes) -> bytes:
    """The kind byte of a head (``b""`` when it does not start with the magic)."""
    return head[len(MAGIC):len(MAGIC) + 1] if head.startswith(MAGIC) else b""


def parse_chunked(head: bytes | None, spread: bool = False) -> ChunkedHead | None:
    """The chunk count and length of a chunked head (``P:blob:``, kinds ``C`` / ``K``), or with ``spread`` of a
    spread head (``P:spread:``, kinds ``S`` / ``T``); None when ``head`` is not one or is impossible (no chunk, or
    more chunks than stored bytes: every chunk holds at least one)."""
    kinds = (SPREAD_ZSTD, SPREAD_RAW) if spread else (CHUNKED_ZSTD, CHUNKED_RAW)
    if head is None or len(head) != CHUNKED_HEAD_BYTES or head_kind(head) not in kinds:
        return None
    count, total = HEAD_CHUNKED.unpack_from(head, len(MAGIC) + 1)
    if count < 1 or count > total:
        return None
    return ChunkedHead(count, total, head_kind(head) in (CHUNKED_RAW, SPREAD_RAW), spread)


def head_limit(max_bytes: int) -> int:
    """Most bytes of a head worth reading for a blob of at most ``max_bytes`` bytes (a GETRANGE's length): an inline
    head holds the magic, its kind byte and at most :func:`~cache_backends.bounded.frame_bound` bytes of payload; a
    longer one is refused unread past this."""
    return len(MAGIC) + 1 + frame_bound(max_bytes)


def check_chunked(head: ChunkedHead, max_bytes: int) -> None:
    """Refuse, before any chunk is read, a chunked head whose stored length cannot hold a blob of at most
    ``max_bytes`` bytes.

    Raises:
        InputLimitError: the head states more stored bytes than such a blob is stored as.
    """
    if head.total > (max_bytes if head.raw else frame_bound(max_bytes)):
        raise InputLimitError(f"its head states {head.total} stored bytes, more than a blob of at most {max_bytes} "
                              "bytes is stored as")


def decode_inline(digest: str, head: bytes, max_bytes: int) -> tuple[bytes | None, str]:
    """An inline blob's bytes, verified: ``(bytes, "")``, or ``(None, why)`` if it does not decompress or does
    not hash to ``digest``.

    Raises:
        InputLimitError: it is (or decompresses to) more than ``max_bytes`` bytes; refused before it is allocated.
    """
    payload = memoryview(head)[len(MAGIC) + 1:]
    if head_kind(head) == INLINE_RAW:
        if len(payload) > max_bytes:
            raise InputLimitError(f"it holds {len(payload)} bytes, more than the {max_bytes} accepted")
        data = bytes(payload)
    else:
        try:
            data = inflate(payload, max_bytes)
        except InputLimitError:
            raise
        except ValueError as err:
            return None, f"does not decompress ({err})"
    if digest_bytes(data) != digest:
        return None, "does not match its digest"
    return data, ""


def chunk_limit(head: ChunkedHead) -> int:
    """Most bytes one chunk of ``head``'s blob can hold, whatever chunk size its writer used: a writer of chunks of
    ``c`` bytes makes ``count = ceil(total / c)`` of them, so ``c < total / (count - 1)``; a spread blob's pieces
    hold at most ``ceil(total / count)`` bytes each.  A chunk longer than this is a lie, read no further (a
    GETRANGE's length)."""
    if head.spread:
        return -(-head.total // head.count)
    return head.total if head.count == 1 else -(-head.total // (head.count - 1))


def read_chunked(digest: str, head: ChunkedHead, fetch: Callable[[range, int], list[bytes | None]],
                 max_bytes: int) -> tuple[bytes | None, str]:
    """A chunked blob's bytes, verified: ``(bytes, "")``, or ``(None, why)`` if a chunk is missing or longer than
    the head allows, the lengths disagree, the frame does not decompress, or the bytes do not hash to ``digest``.

    ``fetch(indices, limit)`` returns those chunks (None for a missing one), each cut at ``limit`` + 1 bytes, in one
    round trip.  Batches of about :data:`PIPELINE_BYTES` (at most :data:`MAX_BATCH` chunks) are fetched by a helper
    thread one batch ahead, while this thread decompresses and hashes (zstd and sha256 release the GIL), so a large
    blob costs about its transfer time.  Batches are made as they are needed and the read stops at the first
    missing or overlong chunk or at ``total`` bytes: a head that claims more chunks than exist costs one batch more,
    never memory.  The frame is decompressed as a stream, :data:`~cache_backends.bounded.STEP` bytes at a time,
    never past ``max_bytes`` bytes, whatever its header says.

    Raises:
        InputLimitError: the head's length, or the frame's output, is over what a blob of ``max_bytes`` bytes takes
            (:func:`check_chunked`); refused before that much is allocated.
        CacheError: ``fetch`` failed.
    """
    check_chunked(head, max_bytes)
    chunks = _Chunks(head, fetch)
    hasher = hashlib.sha256()
    parts: list[bytes] = []
    produced = 0
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            chunks.start(pool)
            source = chunks if head.raw else zstandard.ZstdDecompressor().stream_reader(chunks, read_size=STEP,
                                                                                        read_across_frames=False)
            while True:
                piece = source.read(STEP)
                if not piece:
                    break
                produced += len(piece)
                if produced > max_bytes:
                    raise InputLimitError(f"it decompresses to more than the {max_bytes} bytes accepted")
                hasher.update(piece)
                parts.append(piece)
            chunks.drain()
    except zstandard.ZstdError as err:
        chunks.why = chunks.why or f"does not decompress ({err})"
    why = chunks.why
    if not why and chunks.stored != head.total:
        why = f"has {chunks.stored} bytes of chunks where its head says {head.total}"
    if not why and chunks.trailing:
        why = "holds bytes after its zstd frame"  # (those zstd read ahead are not seen: the digest decides)
    if not why and hasher.hexdigest() != digest:
        why = "does not match its digest (or holds a truncated zstd frame)"
    return (None, why) if why else (b"".join(parts), "")


class _Chunks:
    """The chunks of one blob as a file (``read(n)``) for zstd's stream reader, fetched in batches one ahead.

    Attributes:
        stored: bytes of chunks fetched so far.
        why: the first fault found (a missing or overlong chunk, more bytes than the head states), or "".
        trailing: bytes were left unread when the frame ended (found by :meth:`drain`).
    """

    def __init__(self, head: ChunkedHead, fetch: Callable[[range, int], list[bytes | None]]):
        self.count, self.total = head.count, head.total
        self.limit = chunk_limit(head)
        self.per_batch = min(MAX_BATCH, max(1, PIPELINE_BYTES // max(1, self.limit)))
        self.fetch = fetch
        self.stored = 0
        self.why = ""
        self.trailing = False
        self._next = 0
        self._ahead: Future[list[bytes | None]] | None = None
        self._batch: list[bytes | None] = []
        self._buf = memoryview(b"")

    def start(self, pool: ThreadPoolExecutor) -> None:
        self._pool = pool
        self._ahead = self._submit()

    def _submit(self) -> Future[list[bytes | None]] | None:
        if self._next >= self.count:
            return None
        indices = range(self._next, min(self.count, self._next + self.per_batch))
        self._next = indices.stop
        return self._pool.submit(self.fetch, indices, self.limit)

    def _pull(self) -> bool:
        """Make the next chunk current; False at the end of the chunks or at the first fault."""
        while not self._batch:
            if self._ahead is None or self.why:
                return False
            self._batch = list(reversed(self._ahead.result()))
            self._ahead = self._submit()
        chunk = self._batch.pop()
        if chunk is None:
            self.why = "lacks a chunk (evicted or half written)"
        elif len(chunk) > self.limit:
            self.why = f"has a chunk longer than its head allows ({self.limit} bytes)"
        elif self.stored + len(chunk) > self.total:
            self.why = f"has more bytes of chunks than its head says ({self.total})"
        if self.why:
            self._batch.clear()
            return False
        self.stored += len(chunk)
        self._buf = memoryview(chunk)
        return True

    def read(self, n: int = -1) -> bytes:
        while not self._buf:
            if not self._pull():
                return b""
        size = len(self._buf) if n is None or n < 0 else n
        out, self._buf = self._buf[:size], self._buf[size:]
        return bytes(out)

    def drain(self) -> None:
        """After the frame ended: read what is left, to count it (the lengths must agree) and see if any is left."""
        self.trailing = bool(self._buf)
        while self._pull():
            self.trailing = True
            self._buf = memoryview(b"")
