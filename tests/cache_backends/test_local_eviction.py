"""LocalCache eviction: LRU by ref time, the grace period for fresh unreferenced blobs, one evictor at a time,
pluggable manifest schemas.  Real files and processes, no mocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from _local import KEY, KEY2, blob_file, set_mtime, store_artifact

from cache_backends import MISS, digest_bytes
from cache_backends.local.cache import LocalCache


# --------------------------------------------------------------------------------------------- eviction
def test_lru_eviction(tmp_path):
    cache = LocalCache(tmp_path, max_bytes=60_000, grace_s=0)
    shared = os.urandom(4000)
    keys = [digest_bytes(f"artifact {i}".encode()) for i in range(5)]
    stored = {}
    for i, key in enumerate(keys[:3]):
        stored[key] = store_artifact(cache, key, [shared, os.urandom(8000), os.urandom(8000)])
    assert cache.counters()["evictions"] == 0  # ~ 3 x 16 KB + 4 KB shared: under the cap
    for age, key in zip((300, 200, 100), keys[:3]):
        set_mtime(tmp_path / "ref" / key, age)
    assert cache.get_ref(keys[0]) == stored[keys[0]][0]  # artifact 0 is now the most recently used
    stored[keys[3]] = store_artifact(cache, keys[3], [shared, os.urandom(8000), os.urandom(8000)])
    # 4 x 16 KB + 4 KB > 60 KB: drop LRU refs until <= 54 KB: artifact 1 goes, 0 (read) and 2, 3 stay
    refs = dict(cache.iter_refs())
    assert set(refs) == {keys[0], keys[2], keys[3]}
    assert cache.counters()["evictions"] == 1
    mdigest1, parts1 = stored[keys[1]]
    assert not cache.has_blob(mdigest1) and not any(cache.has_blob(d) for d in parts1[1:])
    assert cache.has_blob(parts1[0])  # the blob shared with surviving artifacts stays
    for key in refs:
        mdigest, parts = stored[key]
        assert json.loads(cache.get_blob(mdigest))["blobs"].keys() == set(parts)
        assert all(cache.get_blob(d) is not MISS for d in parts)
    assert cache.size_bytes() <= 60_000
    assert cache.stats()["bytes_stored"] == cache.size_bytes()


def test_eviction_grace_period_keeps_fresh_unreferenced_blobs(tmp_path):
    cache = LocalCache(tmp_path, max_bytes=25_000)  # default grace: 60 s
    a = store_artifact(cache, KEY, [os.urandom(12_000)])
    set_mtime(tmp_path / "ref" / KEY, 100)
    orphan = cache.put_blob(os.urandom(2_000))  # a concurrent writer whose ref has not landed yet
    b = store_artifact(cache, KEY2, [os.urandom(12_000)])
    assert dict(cache.iter_refs()) == {KEY2: b[0]}
    assert cache.counters()["evictions"] == 1
    # the evicted artifact's blobs and the orphan are unreferenced but fresh: kept
    assert cache.has_blob(orphan) and cache.has_blob(a[0]) and cache.has_blob(a[1][0])
    for d in (orphan, a[0], a[1][0]):
        set_mtime(blob_file(cache, d), 120)
    report = cache.evict()
    assert report["refs_dropped"] == 0 and report["blobs_deleted"] == 3
    assert not cache.has_blob(orphan) and not cache.has_blob(a[0]) and not cache.has_blob(a[1][0])
    assert cache.get_blob(b[1][0]) is not MISS


def test_eviction_skipped_while_another_process_evicts(tmp_path):
    cache = LocalCache(tmp_path, max_bytes=1000, grace_s=0)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import filelock, sys, time; l = filelock.FileLock(sys.argv[1]); l.acquire(); "
         "print('held', flush=True); time.sleep(30)", str(tmp_path / "locks" / "evict.lock")],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        store_artifact(cache, KEY, [os.urandom(2000)])
        store_artifact(cache, KEY2, [os.urandom(2000)])
        assert cache.evict()["skipped"] is True
        assert len(dict(cache.iter_refs())) == 2 and cache.counters()["evictions"] == 0
    finally:
        holder.kill()
        holder.wait()
    assert cache.evict()["skipped"] is False
    assert len(dict(cache.iter_refs())) == 1 and cache.counters()["evictions"] == 1


def test_pluggable_referenced_digests(tmp_path):
    """Another manifest schema: the evictor asks ``referenced_digests`` which blobs a manifest keeps alive."""

    def parts_of(manifest: bytes) -> list[str]:
        return [p["digest"] for p in json.loads(manifest)["parts"]]

    cache = LocalCache(tmp_path, max_bytes=10**9, grace_s=0, referenced_digests=parts_of)
    part = cache.put_blob(b"p" * 100)
    manifest = json.dumps({"parts": [{"digest": part}]}).encode()
    cache.set_ref(KEY, cache.put_blob(manifest))
    garbage = cache.put_blob(b"g" * 100)
    report = cache.evict()
    assert report["blobs_deleted"] == 1
    assert cache.has_blob(part) and not cache.has_blob(garbage)
