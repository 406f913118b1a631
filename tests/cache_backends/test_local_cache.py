"""LocalCache (``file://``): real files, real processes, no mocks.

What every backend does (round trips, names, refs, a corrupt blob, leases, counters, read-only, bounds, an outage)
is in the conformance suite (test_conformance.py); what only a directory does is here: files on disk, LRU times,
damage of each kind, ``verify`` and URLs; eviction in ``test_local_eviction.py``; counters, read-only
directories and many processes on one directory in ``test_local_counters.py``.
"""

from __future__ import annotations

import logging
import os
import time

import pytest
from _local import KEY, KEY2, blob_file, set_mtime, store_artifact

from cache_backends import MISS, open_cache
from cache_backends.local.cache import LocalCache
from precompile.errors import CacheURLError


# ----------------------------------------------------------------------------------------------- basics
def test_blobs_are_zstd_files_written_whole(tmp_path):
    """What a local blob is on disk (round trips, misses and names are in the conformance suite)."""
    cache = LocalCache(tmp_path / "c")
    data = b"triton kernel source\n" * 100
    digest = cache.put_blob(data)
    path = blob_file(cache, digest)
    assert path.is_file() and path.stat().st_size < len(data)  # compressed at rest
    assert path.read_bytes()[:4] == b"\x28\xb5\x2f\xfd"  # zstd magic
    assert cache.counters()["bytes_written"] == path.stat().st_size
    assert cache.get_blob(digest) == data and cache.counters()["bytes_read"] == path.stat().st_size
    assert not list((tmp_path / "c").rglob("*.incomplete"))


def test_put_existing_blob_refreshes_mtime(tmp_path):
    """An idempotent put must protect the blob from eviction's grace-period sweep until the writer's ref lands."""
    cache = LocalCache(tmp_path)
    digest = cache.put_blob(b"x" * 1000)
    set_mtime(blob_file(cache, digest), 3600)
    cache.put_blob(b"x" * 1000)
    assert time.time() - blob_file(cache, digest).stat().st_mtime < 60


def test_get_ref_refreshes_lru_time(tmp_path):
    cache = LocalCache(tmp_path)
    cache.set_ref(KEY, cache.put_blob(b"m"))
    ref = tmp_path / "ref" / KEY
    set_mtime(ref, 3600)
    assert cache.get_ref(KEY) != MISS
    assert time.time() - ref.stat().st_mtime < 60


# ------------------------------------------------------------------------------------------- corruption
@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "garbage"])
def test_corrupt_blob_is_a_miss_and_dropped(tmp_path, damage, caplog):
    cache = LocalCache(tmp_path)
    data = os.urandom(2000) + b"tail" * 500
    digest = cache.put_blob(data)
    path = blob_file(cache, digest)
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x01
    elif damage == "truncate":
        raw = raw[: len(raw) // 2]
    elif damage == "empty":
        raw = bytearray()
    else:
        raw = bytearray(b"not zstd at all" * 10)
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="precompile.cache"):
        assert cache.get_blob(digest) is MISS
    assert not path.exists()
    assert cache.counters()["errors"] == 1
    assert any(digest in r.getMessage() and "corrupt" in r.getMessage() for r in caplog.records)
    assert cache.get_blob(digest) is MISS  # now simply absent: no second error
    assert cache.counters()["errors"] == 1
    assert cache.put_blob(data) == digest and cache.get_blob(digest) == data  # a rewrite heals it


def test_flipped_byte_in_every_position_never_returns_wrong_bytes(tmp_path):
    cache = LocalCache(tmp_path)
    data = b"weights are inputs, kernels are blobs\n" * 20
    digest = cache.put_blob(data)
    path = blob_file(cache, digest)
    good = path.read_bytes()
    for i in range(len(good)):
        bad = bytearray(good)
        bad[i] ^= 0x40
        path.write_bytes(bytes(bad))
        assert cache.get_blob(digest) in (MISS, data)  # a flip in unused header bits may still decode right
        path.write_bytes(good)


def test_corrupt_ref_is_a_miss(tmp_path):
    cache = LocalCache(tmp_path)
    (tmp_path / "ref" / KEY).write_text("not a digest\n")
    assert cache.get_ref(KEY) is MISS
    assert not (tmp_path / "ref" / KEY).exists()
    assert cache.counters()["errors"] == 1


def test_verify(tmp_path):
    cache = LocalCache(tmp_path)
    mdigest, digests = store_artifact(cache, KEY, [b"a" * 100, b"b" * 100])
    cache.set_ref(KEY2, "e" * 64)  # manifest missing
    report = cache.verify()
    assert report["ok"] is False and report["blobs_checked"] == 3
    assert report["bad_blobs"] == [] and report["dangling_refs"] == [KEY2]
    blob_file(cache, digests[0]).write_bytes(b"rubbish")
    blob_file(cache, mdigest).write_bytes(blob_file(cache, mdigest).read_bytes()[:-3])
    report = cache.verify(fix=True)
    assert sorted(report["bad_blobs"]) == sorted([digests[0], mdigest])
    assert sorted(report["dangling_refs"]) == sorted([KEY, KEY2])
    assert report["removed"] == 4
    assert cache.verify()["ok"] is True
    assert list(cache.iter_refs()) == [] and cache.has_blob(digests[1])


# ------------------------------------------------------------------------------------------------- URLs
def test_open_cache_urls(tmp_path):
    cache = open_cache(f"file://{tmp_path}/c")
    assert isinstance(cache, LocalCache) and cache.root == tmp_path / "c"
    assert isinstance(open_cache(str(tmp_path / "d")), LocalCache)
    opts = open_cache(f"file://{tmp_path}/c?max_bytes=12345&read_only=0&grace_s=5")
    assert opts.max_bytes == 12345 and opts.grace_s == 5 and not opts.read_only
    again = open_cache(opts.url)
    assert (again.root, again.max_bytes, again.grace_s, again.url) == (opts.root, 12345, 5, opts.url)
    spaced = open_cache(str(tmp_path / "with space"))
    assert open_cache(spaced.url).root == tmp_path / "with space"
    assert open_cache(cache) is cache


@pytest.mark.parametrize(
    "url, match",
    [
        ("s3://bucket/x", "no cache backend handles s3://"),
        ("file://relative/dir", "three slashes"),
        ("file:///tmp/x?max_bytes=-3", "positive integer"),
        ("file:///tmp/x?max_bytes=lots", "positive integer"),
        ("file:///tmp/x?max_bytes=1e999", "positive integer"),
        ("file:///tmp/x?max_bytes=99999999999999999999", r"at most 1152921504606846976 \(1 EiB\)"),
        ("file:///tmp/x?grace_s=1e306", r"grace_s= .* at most 315360000 \(10 years\)"),
        ("file:///tmp/x?fetch_wait=nan", "fetch_wait="),
        ("file:///tmp/x?level=99", "zstd level"),
        ("file:///tmp/x?read_only=maybe", "read_only"),
        ("file:///tmp/x?colour=blue", "unknown option 'colour'"),
        ("file:///tmp/x#frag", "fragment"),
        ("", "non-empty"),
    ],
)
def test_bad_urls(url, match):
    with pytest.raises(CacheURLError, match=match):
        open_cache(url)
    with pytest.raises(ValueError):  # CacheURLError is a ValueError too
        open_cache(url)


def test_from_url_rejects_other_schemes():
    with pytest.raises(CacheURLError, match="file://"):
        LocalCache.from_url("redis://localhost:6379")
