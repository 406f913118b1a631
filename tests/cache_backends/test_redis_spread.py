"""The spread layout (cache_backends/redis/spread.py) on a real Redis Cluster of 3 masters with a replica each: a blob's
pieces spread evenly over every master, read back, listed, checked and dropped whole; a missing piece is a miss; and
entries in the chunked layout (every blob precompile stored before the spread layout) are still read, never an
error."""

from __future__ import annotations

import os
import struct
from collections import Counter

import zstandard
from _cache_backends import unique_prefix
from redis.crc import key_slot

from cache_backends import MISS, digest_bytes, open_cache
from cache_backends.redis import spread


def test_bin_tags_land_in_their_bins_and_pieces_cover_the_blob():
    tags = spread.bin_tags()
    assert len(set(tags)) == spread.SLOT_BINS
    assert all(key_slot(f"p:{{{tag}}}x".encode()) // (16384 // spread.SLOT_BINS) == b for b, tag in enumerate(tags))
    for stored, chunk in ((16_385, 4 << 20), (3_000_000, 1 << 20), (100_000_000, 4 << 20), (7, 1)):
        count = spread.piece_count(stored, chunk)
        bounds = spread.piece_bounds(stored, count)
        assert count % spread.SPREAD_MULTIPLE == 0 or count == stored
        assert bounds[0][0] == 0 and bounds[-1][1] == stored and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        assert 0 < max(e - s for s, e in bounds) <= min(chunk, spread.piece_limit(stored, count))


def test_a_blobs_pieces_spread_evenly_over_every_master(redis_cluster):
    prefix = unique_prefix()
    cache = open_cache(redis_cluster.url(prefix=prefix, chunk_size="4KiB"))
    assert cache.spread
    blobs = [os.urandom(24_000) for _ in range(12)]  # raw: 6 pieces of 4,000 bytes each
    digests = [cache.put_blob(b) for b in blobs]
    client, per_master = cache.client, Counter()
    for d in digests:
        assert not client.exists(f"{prefix}:blob:{{{d}}}") and client.exists(f"{prefix}:spread:{{{d}}}")
        keys = [cache._piece_key(d, i, 6) for i in range(6)]
        assert all(client.exists(k) for k in keys) and not client.exists(cache._piece_key(d, 6, 6))
        masters = Counter(client.get_node_from_key(k).name for k in keys)
        assert len(masters) == 3, f"blob {d[:12]}'s pieces are on {dict(masters)}"
        per_master.update(masters)
    assert max(per_master.values()) <= 26, per_master  # 72 pieces: 24 a master, but where a slot range ends
    assert cache.get_blobs(digests) == dict(zip(digests, blobs))
    listed = {b.digest: b.stored_bytes for b in cache.list_blobs()}
    assert set(listed) == set(digests) and all(size > 24_000 for size in listed.values())
    assert cache.check_blob(digests[0]) == (24_000, None)
    victim = next(b for b in cache.list_blobs() if b.digest == digests[0])
    assert cache.drop_blob(victim) and not any(client.exists(cache._piece_key(digests[0], i, 6)) for i in range(6))
    assert cache.get_blob(digests[0]) is MISS and cache.counters().get("errors", 0) == 0  # gone, not damaged
    cache.close()


def test_a_missing_piece_makes_the_blob_a_miss_and_the_rest_is_dropped(redis_cluster):
    cache = open_cache(redis_cluster.url(prefix=unique_prefix(), chunk_size="4KiB"))
    data = os.urandom(24_000)
    d = cache.put_blob(data)
    piece = cache._piece_key(d, 3, 6)
    node = redis_cluster.node_of(piece)
    node.client().delete(piece)  # evicted, say
    node.client().execute_command("WAIT", 1, 1000)
    assert cache.get_blob(d) is MISS and cache.counters()["errors"] == 1
    assert not cache.has_blob(d) and not any(cache.client.exists(cache._piece_key(d, i, 6)) for i in range(6))
    assert cache.put_blob(data) == d and cache.get_blob(d) == data  # the next store heals it
    cache.close()


def write_chunked_layout(client, prefix: str, data: bytes, chunk: int) -> str:
    """Store ``data`` as precompile did before the spread layout: a zstd frame in chunks of ``chunk`` bytes under
    the blob's hash tag, then its head ``PCB1`` ``C`` <count, length>."""
    digest = digest_bytes(data)
    frame = zstandard.ZstdCompressor(level=3).compress(data)
    count = -(-len(frame) // chunk)
    for i in range(count):
        client.set(f"{prefix}:blob:{{{digest}}}:{i}", frame[i * chunk:(i + 1) * chunk])
    client.set(f"{prefix}:blob:{{{digest}}}", b"PCB1C" + struct.pack("<IQ", count, len(frame)))
    return digest


def test_entries_in_the_chunked_layout_are_still_read(redis_cluster, redis_server):
    data = os.urandom(30_000) + bytes(30_000)  # compresses to ~30 KB: 8 chunks of 4 KiB
    for target in (redis_cluster, redis_server):
        prefix = unique_prefix()
        head = f"{prefix}:blob:{{{digest_bytes(data)}}}"
        writer = target.node_of(head).client() if target is redis_cluster else target.client()
        d = write_chunked_layout(writer, prefix, data, 4096)
        if target is redis_cluster:
            writer.execute_command("WAIT", 1, 1000)  # on the replicas too
        cache = open_cache(target.url(prefix=prefix, spread=1))
        assert cache.spread and cache.has_blob(d) and cache.has_blobs([d]) == {d: True}
        assert cache.get_blobs([d]) == {d: data} and cache.get_blob(d) == data
        assert cache.put_blob(data) == d and not writer.exists(f"{prefix}:spread:{{{d}}}")  # stored: not rewritten
        assert cache.check_blob(d) == (len(data), None) and [b.digest for b in cache.list_blobs()] == [d]
        assert cache.counters().get("errors", 0) == 0
        cache.close()
