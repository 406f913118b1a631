"""Where the pieces of a spread blob live: evenly over a Redis Cluster's hash slots, so over every master.

A blob whose chunks share its ``{<digest>}`` hash tag lives on one slot: one master (and its replicas) serves every
copy a fleet reads, however many masters the cluster has.  A spread blob (``spread=1``, the default on a cluster:
:mod:`cache_backends.redis.codec`, kinds ``S`` and ``T``) is cut into a multiple of :data:`SPREAD_MULTIPLE` pieces of
equal length, and piece ``i`` of ``n`` carries a hash tag of its own, chosen so that its slot falls in bin
``(first + floor(i * SLOT_BINS / n)) mod SLOT_BINS`` of the :data:`SLOT_BINS` equal ranges of the 16384 slots
(``first`` is read from the digest, so that blobs start at different places).  The pieces of one blob are thus evenly
spaced around the slot ring: with masters owning equal contiguous ranges of slots (as ``redis-cli --cluster
create`` and ``rebalance`` leave them), each of 1, 2, 3 or 6 masters serves the same share of every spread blob,
within one bin's width at the ranges' edges, and 4 or 5 masters within one piece.

The tag of a bin is the decimal text of the smallest integer whose CRC16 (Redis Cluster's key hash) falls in that
bin (:func:`bin_tags`): a pure function of the bin, computed once per process (about 1,600 CRCs), so every writer
and reader agrees on every key without storing any.  Placement only decides which node serves a piece; a reader
finds a piece by its key whatever the cluster's layout, and a cluster resharded unevenly is still read right, only
less evenly.
"""

from __future__ import annotations

import binascii
import functools

#: Pieces of a spread blob come in multiples of this: an even share for clusters of 1, 2, 3 or 6 masters.
SPREAD_MULTIPLE = 6
#: Equal ranges of the 16384 hash slots a piece is aimed at (64 slots each).
SLOT_BINS = 256
#: Hash slots of a Redis Cluster.
SLOTS = 16384


def piece_count(stored: int, chunk_bytes: int) -> int:
    """Pieces of a blob whose stored form is ``stored`` bytes: the least multiple of :data:`SPREAD_MULTIPLE` whose
    pieces hold at most ``chunk_bytes`` bytes each (and at most ``stored``: every piece holds at least one byte)."""
    count = SPREAD_MULTIPLE * -(-stored // (SPREAD_MULTIPLE * chunk_bytes))
    return max(1, min(count, stored))


def piece_bounds(stored: int, count: int) -> list[tuple[int, int]]:
    """``[(start, end)]`` of each of the ``count`` pieces of ``stored`` bytes: piece ``i`` is bytes
    ``i * stored // count`` to ``(i + 1) * stored // count``, so none is empty (``count <= stored``) and none holds
    more than ``ceil(stored / count)`` bytes, the most a reader accepts (:func:`piece_limit`)."""
    return [(i * stored // count, (i + 1) * stored // count) for i in range(count)]


def piece_limit(stored: int, count: int) -> int:
    """Most bytes a piece of a spread blob holds: ``ceil(stored / count)``."""
    return -(-stored // count)


@functools.cache
def bin_tags() -> tuple[str, ...]:
    """The hash tag of each slot bin: the decimal text of the smallest integer whose key slot
    (``CRC16 mod 16384``) is in that bin."""
    width, tags, n = SLOTS // SLOT_BINS, [""] * SLOT_BINS, 0
    missing = SLOT_BINS
    while missing:
        text = str(n)
        b = (binascii.crc_hqx(text.encode(), 0) % SLOTS) // width
        if not tags[b]:
            tags[b] = text
            missing -= 1
        n += 1
    return tuple(tags)


def piece_tag(digest: str, i: int, count: int) -> str:
    """The hash tag of piece ``i`` of the ``count`` pieces of blob ``digest`` (see the module docstring)."""
    first = int(digest[:8], 16) % SLOT_BINS
    return bin_tags()[(first + i * SLOT_BINS // count) % SLOT_BINS]
