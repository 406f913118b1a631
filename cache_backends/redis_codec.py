"""How a blob is stored in Redis: its head (inline bytes, or a chunk count and length) and its chunks.

``P:blob:{<digest>}`` holds ``b"PCB1"`` + a kind byte + a payload:

- ``Z`` / ``R``: the payload is the whole blob, as a zstd frame / the raw bytes;
- ``C`` / ``K``: the payload is struct ``<IQ`` (chunk count, stored length in bytes); chunks
  ``P:blob:{<digest>}:<i>`` hold a zstd frame / the raw bytes.

Raw is used where zstd saves less than :data:`RAW_IF_SAVING_BELOW` of the size (kernel binaries, random data).
Reading verifies everything: a head that does not parse, a chunk that is missing, lengths that disagree, a frame
that does not decompress or bytes that do not hash to the digest make the blob a miss.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import zstandard

from cache_backends.base import _MAX_RATIO, decompress_frame, digest_bytes

MAGIC = b"PCB1"
HEAD_CHUNKED = struct.Struct("<IQ")
INLINE_ZSTD, INLINE_RAW, CHUNKED_ZSTD, CHUNKED_RAW = b"Z", b"R", b"C", b"K"
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
    """A chunked blob's head: ``count`` chunks holding ``total`` stored bytes, raw or one zstd frame."""

    count: int
    total: int
    raw: bool


def inline_head(payload: bytes, raw: bool) -> bytes:
    """The head of a blob stored whole: a zstd frame (``raw`` False) or the raw bytes."""
    return MAGIC + (INLINE_RAW if raw else INLINE_ZSTD) + payload


def chunked_head(count: int, total: int, raw: bool) -> bytes:
    """The head of a blob stored as ``count`` chunks holding ``total`` bytes."""
    return MAGIC + (CHUNKED_RAW if raw else CHUNKED_ZSTD) + HEAD_CHUNKED.pack(count, total)


def head_kind(head: bytes) -> bytes:
    """The kind byte of a head (``b""`` when it does not start with the magic)."""
    return head[len(MAGIC):len(MAGIC) + 1] if head.startswith(MAGIC) else b""


def parse_chunked(head: bytes | None) -> ChunkedHead | None:
    """The chunk count and length of a chunked head, or None when ``head`` is not one or is impossible (no
    chunk, or more chunks than stored bytes: every chunk holds at least one)."""
    if (head is None or len(head) != CHUNKED_HEAD_BYTES or head_kind(head) not in (CHUNKED_ZSTD, CHUNKED_RAW)):
        return None
    count, total = HEAD_CHUNKED.unpack_from(head, len(MAGIC) + 1)
    if count < 1 or count > total:
        return None
    return ChunkedHead(count, total, head_kind(head) == CHUNKED_RAW)


def decode_inline(digest: str, head: bytes) -> tuple[bytes | None, str]:
    """An inline blob's bytes, verified: ``(bytes, "")``, or ``(None, why)`` if it does not decompress or does
    not hash to ``digest``."""
    payload = memoryview(head)[len(MAGIC) + 1:]
    if head_kind(head) == INLINE_RAW:
        data = bytes(payload)
    else:
        try:
            data = decompress_frame(bytes(payload))
        except ValueError as err:
            return None, f"does not decompress ({err})"
    if digest_bytes(data) != digest:
        return None, "does not match its digest"
    return data, ""


def read_chunked(digest: str, head: ChunkedHead, chunk_bytes: int,
                 fetch: Callable[[range], list[bytes | None]]) -> tuple[bytes | None, str]:
    """A chunked blob's bytes, verified: ``(bytes, "")``, or ``(None, why)`` if a chunk is missing, the lengths
    disagree, the frame does not decompress, or the bytes do not hash to ``digest``.

    ``fetch(indices)`` returns those chunks (None for a missing one) in one round trip.  Batches of about
    :data:`PIPELINE_BYTES` (at most :data:`MAX_BATCH` chunks) are fetched by a helper thread one batch ahead,
    while this thread decompresses and hashes (zstd and sha256 release the GIL), so a large blob costs about its
    transfer time.  Batches are made as they are needed and the read stops at the first missing chunk or at
    ``total`` bytes: a head that claims more chunks than exist costs one batch more, never memory.

    Raises:
        CacheError: ``fetch`` failed.
    """
    count, total = head.count, head.total
    per_batch = min(MAX_BATCH, max(1, PIPELINE_BYTES // chunk_bytes))
    starts = range(0, count, per_batch)
    hasher = hashlib.sha256()
    parts: list[bytes] = []
    stored = produced = 0
    limit = total * _MAX_RATIO + (1 << 20)
    dobj = None if head.raw else zstandard.ZstdDecompressor().decompressobj()
    why = ""
    with ThreadPoolExecutor(max_workers=1) as pool:
        ahead = pool.submit(fetch, range(0, min(count, per_batch)))
        for n in range(len(starts)):
            chunks = ahead.result()
            if n + 1 < len(starts):
                nxt = starts[n + 1]
                ahead = pool.submit(fetch, range(nxt, min(count, nxt + per_batch)))
            for chunk in chunks:
                if chunk is None:
                    why = "lacks a chunk (evicted or half written)"
                    break
                stored += len(chunk)
                if stored > total:
                    break
                try:
                    piece = chunk if dobj is None else dobj.decompress(chunk)
                except zstandard.ZstdError as err:
                    why = f"does not decompress ({err})"
                    break
                produced += len(piece)
                if produced > limit:
                    why = f"decompresses to more than {limit} bytes"
                    break
                hasher.update(piece)
                parts.append(piece)
            if why or stored > total:
                break
    if not why and stored != total:
        why = f"has {stored} bytes of chunks where its head says {total}"
    if not why and dobj is not None and not dobj.eof:
        why = "holds a truncated zstd frame"
    if not why and hasher.hexdigest() != digest:
        why = "does not match its digest"
    return (None, why) if why else (b"".join(parts), "")
