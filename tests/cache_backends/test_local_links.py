"""A local cache never follows a link out of itself, and never quotes what it reads (issue 34, item 4).

Whoever can write a shared (1777) cache directory can plant a symbolic link where a ref, a blob, a lock or a cache
directory belongs, pointing at a file only the worker can read or write.  Each such link is a miss, never read,
written or truncated through; the next write puts a real file in its place; and no message carries the bytes of what
it names.  A cache directory others may write is warned about once.  Real directories, real links, no mocks.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat

import pytest
import zstandard

from cache_backends.base import MISS, digest_bytes
from cache_backends.local.cache import LocalCache
from cache_backends.local.fetch import FetchLock


@pytest.fixture
def secret(tmp_path):
    """A file outside the cache holding a random secret (not hex, so that no reader could take it for a digest)."""
    text = "SECRET-" + secrets.token_urlsafe(24)
    path = tmp_path / "secret.txt"
    path.write_text(text)
    path.chmod(0o600)
    return path, text


def test_a_ref_linked_to_a_secret_is_a_miss_never_quoted_and_a_write_replaces_it(secret, tmp_path, caplog):
    path_secret, text = secret
    cache = LocalCache(tmp_path / "c")
    key = digest_bytes(b"key")
    digest = cache.put_blob(b"manifest")
    ref = cache._ref_path(key)
    os.symlink(path_secret, ref)
    reader = LocalCache(tmp_path / "c", read_only=True)
    with caplog.at_level(logging.DEBUG, logger="precompile"):
        assert reader.get_ref(key) is MISS and ref.is_symlink()  # a read-only reader leaves it
        assert reader.list_refs()[0].digest == "" and list(reader.iter_refs()) == []
        assert cache.get_ref(key) is MISS
    assert text not in caplog.text and "symbolic link" in caplog.text
    assert not ref.is_symlink()  # dropped by the writable reader
    os.symlink(path_secret, ref)
    cache.set_ref(key, digest)
    assert stat.S_ISREG(os.lstat(ref).st_mode) and cache.get_ref(key) == digest
    assert path_secret.read_text() == text


def test_a_blob_linked_to_a_file_outside_is_a_miss_even_when_that_file_is_a_valid_blob(secret, tmp_path, caplog):
    path_secret, text = secret
    cache = LocalCache(tmp_path / "c")
    data = b"kernel bytes " * 50
    digest = digest_bytes(data)
    outside = tmp_path / "outside-blob"
    outside.write_bytes(zstandard.ZstdCompressor().compress(data))  # what the blob file would hold
    path = cache._blob_path(digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, path)
    with caplog.at_level(logging.DEBUG, logger="precompile"):
        assert cache.get_blob(digest) is MISS  # never read through the link, valid or not
        assert not cache.has_blob(digest)
        other = digest_bytes(b"other")
        cache._blob_path(other).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(path_secret, cache._blob_path(other))
        assert cache.get_blobs([other]) == {other: MISS}
        assert cache.check_blob(other)[0] is None
    assert text not in caplog.text
    assert cache.put_blob(data) == digest and stat.S_ISREG(os.lstat(path).st_mode)
    assert cache.get_blob(digest) == data
    assert path_secret.read_text() == text and outside.exists()


def test_lock_files_linked_elsewhere_are_replaced_never_locked_or_truncated_through(secret, tmp_path):
    path_secret, text = secret
    cache = LocalCache(tmp_path / "c")
    locks = tmp_path / "c" / "locks"
    (locks / "fetch").mkdir(parents=True, exist_ok=True)
    for name in ("stats.lock", "evict.lock", "fetch/abc.lock"):
        os.symlink(path_secret, locks / name)
    cache.incr(hits=1)
    assert LocalCache(tmp_path / "c").counters()["hits"] == 1  # persisted: the lock was taken
    cache.evict()
    with FetchLock(locks, ["abc" + "0" * 61], wait_s=1.0) as waited:
        assert waited == set()
    for name in ("stats.lock", "evict.lock", "fetch/abc.lock"):
        assert stat.S_ISREG(os.lstat(locks / name).st_mode), name
    assert path_secret.read_text() == text


def test_counters_linked_to_a_secret_are_never_read(secret, tmp_path, caplog):
    path_secret, text = secret
    cache = LocalCache(tmp_path / "c")
    os.symlink(path_secret, tmp_path / "c" / "stats.json")
    with caplog.at_level(logging.DEBUG, logger="precompile"):
        assert cache.counters()["hits"] == 0
        cache.incr(hits=2)
    assert text not in caplog.text
    assert not (tmp_path / "c" / "stats.json").is_symlink() and cache.counters()["hits"] == 2
    assert path_secret.read_text() == text


def test_a_link_in_a_cache_directorys_place_is_never_followed(tmp_path):
    root = tmp_path / "c"
    LocalCache(root).put_blob(b"x")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    key, digest = digest_bytes(b"k"), digest_bytes(b"x")
    (elsewhere / key).write_text(digest + "\n")
    (root / "ref").rmdir()
    os.symlink(elsewhere, root / "ref")
    reader = LocalCache(root, read_only=True)
    assert reader.get_ref(key) is MISS  # never read through ref/
    writer = LocalCache(root)  # a writer replaces the link with a directory
    assert (root / "ref").is_dir() and not (root / "ref").is_symlink()
    writer.set_ref(key, digest)
    assert writer.get_ref(key) == digest
    assert (elsewhere / key).read_text() == digest + "\n" and sorted(p.name for p in elsewhere.iterdir()) == [key]


def test_a_cache_directory_writable_by_others_is_warned_about_once(tmp_path, caplog):
    shared, private = tmp_path / "shared", tmp_path / "private"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)  # the sticky bit is no protection against planted entries
    private.mkdir(mode=0o700)
    with caplog.at_level(logging.DEBUG, logger="precompile"):
        for _ in range(2):
            LocalCache(shared)
            LocalCache(private)
    warned = [r for r in caplog.records if "writable by other users" in r.getMessage()]
    assert [r.levelno for r in warned] == [logging.WARNING, logging.DEBUG], warned
    assert str(shared) in warned[0].getMessage() and "1777" in warned[0].getMessage()
