"""Untrusted reads of the backends (issue 30, finding 3) in fresh processes under a memory limit: a FIFO, a device
or a directory where a ref, a blob or the counters were, a blob larger than its reader accepts, a zstd frame that
inflates to 1 GiB (with and without a stated size), a Redis chunked blob lying about its length.  Each is a miss
(or the counters read as zero) within 10 s, its peak memory bounded, nothing stored damaged by the refusal; real
directories and a real redis-server (tests/_probe.py runs each probe).
"""

from __future__ import annotations

import os
import struct

import pytest
from _local import KEY, blob_file
from _probe import assert_refused, probe, zstd_bomb

from cache_backends import MISS, open_cache
from cache_backends.bounded import MAX_MANIFEST_BYTES
from cache_backends.local.cache import LocalCache
from cache_backends.redis.codec import MAGIC

GiB = 1 << 30
LOCAL_PROBE = """
from cache_backends import MISS
from cache_backends.local.cache import LocalCache
cache = LocalCache(sys.argv[1])
key, digest, bound = sys.argv[2], sys.argv[3], int(sys.argv[4])
measure(lambda: repr(cache.get_ref(key)))
measure(lambda: repr(cache.get_blob(digest, bound)))
measure(lambda: cache.counters())
"""


def local_cache(tmp_path) -> tuple[LocalCache, str]:
    cache = LocalCache(tmp_path / "c")
    digest = cache.put_blob(b'{"schema": 3, "blobs": {}}')
    cache.set_ref(KEY, digest)
    cache.incr(hits=1)
    return cache, digest


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "directory"])
def test_a_ref_a_blob_and_the_counters_that_are_not_regular_files_are_misses(tmp_path, kind):
    cache, digest = local_cache(tmp_path)
    planted = [cache.root / "ref" / KEY, blob_file(cache, digest), cache.root / "stats.json"]
    for path in planted:
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "dev_zero":
            path.symlink_to("/dev/zero")
        else:
            path.mkdir()
    ref, blob, counters = probe(LOCAL_PROBE, str(cache.root), KEY, digest, str(MAX_MANIFEST_BYTES))
    for result, what in ((ref, "ref"), (blob, "blob"), (counters, "counters")):
        assert_refused(result, None, what=f"{kind} as the {what}")
    assert ref["value"] == "MISS" and blob["value"] == "MISS" and counters["value"]["hits"] == 0
    # what is not a regular file is dropped (the ref, the blob); a directory is left where it cannot be moved
    if kind != "directory":
        assert not os.path.lexists(planted[0]) and not os.path.lexists(planted[1])
    # the next writer puts the blob back, and it reads
    cache.put_blob(b'{"schema": 3, "blobs": {}}')
    if kind != "directory":
        assert cache.get_blob(digest) == b'{"schema": 3, "blobs": {}}'


def test_a_ref_that_is_a_fifo_is_listed_as_garbled_and_verify_drops_it(tmp_path):
    cache, digest = local_cache(tmp_path)
    (cache.root / "ref" / KEY).unlink()
    os.mkfifo(cache.root / "ref" / KEY)
    (listed, checked) = probe("""
from cache_backends.local.cache import LocalCache
from precompile.ops.verify import fix, verify
import precompile.key.graph  # imports torch: not what is measured
cache = LocalCache(sys.argv[1])
measure(lambda: [[r.key, r.digest] for r in cache.list_refs()])
measure(lambda: fix(cache, verify(cache)).dropped_refs)
""", str(cache.root))
    assert_refused(listed, None, what="a FIFO ref listed")
    assert_refused(checked, None, what="a FIFO ref verified")
    assert listed["value"] == [[KEY, ""]] and checked["value"] == [KEY]
    assert not os.path.lexists(cache.root / "ref" / KEY)


@pytest.mark.parametrize("with_size", [True, False])
def test_a_local_blob_that_inflates_to_1_gib_is_refused_at_its_bound_and_kept(tmp_path, with_size):
    cache, digest = local_cache(tmp_path)
    path = blob_file(cache, digest)
    path.write_bytes(zstd_bomb(GiB, with_size=with_size))
    _, blob, counters = probe(LOCAL_PROBE, str(cache.root), KEY, digest, str(MAX_MANIFEST_BYTES))
    assert_refused(blob, None, max_grew_mib=64, what="a 1 GiB zstd bomb as a manifest")
    assert blob["value"] == "MISS" and counters["value"]["over_limit"] == 1 and counters["value"]["errors"] == 1
    assert path.stat().st_size < 64 << 10  # left in place: it may be another entry's intact blob


def test_a_blob_one_byte_over_its_bound_is_a_counted_miss_and_stays(tmp_path):
    cache = LocalCache(tmp_path / "c")
    data = os.urandom(5000)
    digest = cache.put_blob(data)
    assert cache.get_blobs([digest], {digest: len(data) - 1}) == {digest: MISS}
    assert cache.counters()["over_limit"] == 1
    assert cache.get_blobs([digest], {digest: len(data)}) == {digest: data}


# -------------------------------------------------------------------------------------------------- Redis
REDIS_PROBE = """
from cache_backends import open_cache
from cache_backends.bounded import MAX_MANIFEST_BYTES
cache = open_cache(sys.argv[1])
for digest in sys.argv[2:]:
    measure(lambda: repr(cache.get_blob(digest, MAX_MANIFEST_BYTES)))
measure(lambda: cache.counters())
"""


def test_a_redis_value_that_inflates_to_1_gib_is_refused_at_the_manifest_cap_and_kept(redis_server):
    url = redis_server.url(counters=1)
    r = redis_server.client()
    digests = {}
    for with_size in (True, False):
        digest = open_cache(url).put_blob(f"manifest {with_size}".encode())
        r.set(f"precompile:blob:{{{digest}}}", MAGIC + b"Z" + zstd_bomb(GiB, with_size=with_size))
        digests[with_size] = digest
    *blobs, counters = probe(REDIS_PROBE, url, *digests.values())
    for blob in blobs:
        assert_refused(blob, None, max_grew_mib=64, what="a 32 KiB Redis value inflating to 1 GiB")
        assert blob["value"] == "MISS"
    assert all(r.exists(f"precompile:blob:{{{d}}}") for d in digests.values())  # refused, not dropped


def chunked(r, digest: str, count: int, total: int, chunks: list[bytes], raw: bool = True) -> None:
    r.set(f"precompile:blob:{{{digest}}}", MAGIC + (b"K" if raw else b"C") + struct.pack("<IQ", count, total))
    for i, c in enumerate(chunks):
        r.set(f"precompile:blob:{{{digest}}}:{i}", c)


def test_a_redis_chunked_blob_lying_about_its_length_is_read_no_further_than_its_head(redis_server):
    url = redis_server.url(chunk_size="1KiB", counters=1)
    cache = open_cache(url)
    r = redis_server.client()
    names = [cache.put_blob(f"blob {i}".encode()) for i in range(4)]
    chunked(r, names[0], 1, 10, [b"\0" * (256 << 20)])  # a chunk of 256 MiB where the head says 10 bytes
    chunked(r, names[1], 2, 1 << 40, [b"x"] * 2)  # a head claiming 1 TiB: refused before any chunk is read
    chunked(r, names[2], 4, 4096, [zstd_bomb(GiB, with_size=False)[:1024]] * 4, raw=False)  # inflates past
    bomb = zstd_bomb(GiB)
    chunked(r, names[3], -(-len(bomb) // 1024), len(bomb),
            [bomb[i:i + 1024] for i in range(0, len(bomb), 1024)], raw=False)
    *blobs, counters = probe(REDIS_PROBE, url, *names)
    for i, blob in enumerate(blobs):
        assert_refused(blob, None, max_grew_mib=96, what=f"lying chunked blob {i}")
        assert blob["value"] == "MISS"
    assert counters["value"]["over_limit"] >= 2
    assert not r.exists(f"precompile:blob:{{{names[0]}}}")  # a chunk longer than its head allows: corrupt, dropped
    assert r.exists(f"precompile:blob:{{{names[1]}}}") and r.exists(f"precompile:blob:{{{names[3]}}}")


REF_PROBE = """
from cache_backends import open_cache
cache = open_cache(sys.argv[1])
measure(lambda: repr(cache.get_ref(sys.argv[2])))
measure(lambda: len(list(cache.iter_refs())))
measure(lambda: len(cache.list_refs()))
"""


def test_a_huge_redis_ref_costs_a_read_only_worker_256_bytes(redis_server):
    """A ref holds one digest: a 256 MiB value planted in its place is read 256 bytes at a time (GETRANGE), by
    lookups, listings and upkeep, and is a miss; a worker that may not write leaves it, a writer replaces it."""
    url = redis_server.url()
    r = redis_server.client()
    r.set(f"precompile:ref:{KEY}", b"a" * (256 << 20))
    ref, listed, upkeep = probe(REF_PROBE, redis_server.url(read_only=1), KEY)
    for result, what in ((ref, "get_ref"), (listed, "iter_refs"), (upkeep, "list_refs")):
        assert_refused(result, None, max_grew_mib=32, what=f"a 256 MiB ref, {what}")
    assert ref["value"] == "MISS" and listed["value"] == 0 and upkeep["value"] == 1
    cache = open_cache(url)
    digest = cache.put_blob(b"x")
    cache.set_ref(KEY, digest)
    assert cache.get_ref(KEY) == digest
