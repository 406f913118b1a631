"""Self-healing (issue 30, finding 5): a key of the wrong type in Redis (a hash, a list, a set... where a blob's
head, a chunk or a ref was) or something other than a file at a local cache's blob or ref path is a miss, dropped
when detected or replaced by the next store, so that the load after that hits.  Before, ``put_blob`` saw that the
key existed and never rewrote it: every load missed and rebuilt, forever.  Real redis-server, real files."""

from __future__ import annotations

import json
import os
import socket
import tempfile

import pytest
from conftest import assert_same_output

import precompile
from cache_backends import open_cache
from cache_backends.base import MISS, digest_bytes
from cache_backends.local.cache import LocalCache
from precompile.errors import CacheReadOnlyError

TYPES = ["hash", "list", "set", "zset", "stream"]


def plant_type(client, key: str, kind: str) -> None:
    """Replace ``key`` by a key of type ``kind``."""
    client.delete(key)
    {"hash": lambda: client.hset(key, "f", "v"), "list": lambda: client.rpush(key, "v"),
     "set": lambda: client.sadd(key, "v"), "zset": lambda: client.zadd(key, {"v": 1.0}),
     "stream": lambda: client.xadd(key, {"f": "v"})}[kind]()
    assert client.type(key).decode() == kind


def key_type(client, key: str) -> str:
    return client.type(key).decode()


# ------------------------------------------------------------------------------------------------------ Redis
@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("size, where", [(100, "head"), (5000, "head"), (5000, "chunk")])
@pytest.mark.parametrize("ttl", [None, 60])
def test_a_wrong_typed_blob_key_is_a_miss_dropped_then_replaced(kind, size, where, ttl, redis_server):
    options = {"chunk_size": "1KiB"} | ({"ttl": ttl} if ttl else {})
    cache = open_cache(redis_server.url(**options))
    reader = open_cache(redis_server.url(read_only=1, chunk_size="1KiB"))
    client = redis_server.client()
    data = os.urandom(size)  # random: stored raw, so 5000 bytes make 5 chunks of 1 KiB
    digest = cache.put_blob(data)
    head = f"precompile:blob:{{{digest}}}"
    plant_type(client, head if where == "head" else f"{head}:1", kind)
    assert reader.get_blob(digest) is MISS  # read-only: a miss, never an exception, nothing dropped
    assert key_type(client, head if where == "head" else f"{head}:1") == kind
    if where == "head":
        assert not cache.has_blob(digest) and cache.has_blobs([digest]) == {digest: False}
    errors = cache.counters()["errors"]
    if where == "chunk":  # a writer's read finds it and drops the blob (head and chunks)
        assert cache.get_blob(digest) is MISS
        assert key_type(client, head) == "none" and key_type(client, f"{head}:1") == "none"
    assert cache.put_blob(data) == digest  # the next store replaces it
    assert cache.counters()["errors"] > errors
    assert reader.get_blob(digest) == data and cache.get_blob(digest) == data
    assert key_type(client, head) == "string"


@pytest.mark.parametrize("kind", TYPES)
def test_a_wrong_typed_ref_is_a_miss_dropped_on_read_skipped_in_listings_and_replaced(kind, redis_server):
    cache = open_cache(redis_server.url())
    client = redis_server.client()
    d = cache.put_blob(b"manifest")
    good, bad = digest_bytes(b"good"), digest_bytes(b"bad")
    cache.set_ref(good, d)
    cache.set_ref(bad, d)
    plant_type(client, f"precompile:ref:{bad}", kind)
    assert dict(cache.iter_refs()) == {good: d}  # the listing goes on
    assert open_cache(redis_server.url(read_only=1)).get_ref(bad) is MISS
    assert key_type(client, f"precompile:ref:{bad}") == kind  # a read-only reader leaves it
    assert cache.get_ref(bad) is MISS  # a writer drops it
    assert key_type(client, f"precompile:ref:{bad}") == "none"
    plant_type(client, f"precompile:ref:{bad}", kind)
    cache.set_ref(bad, d)  # SET replaces a key of any type
    assert cache.get_ref(bad) == d and dict(cache.iter_refs()) == {good: d, bad: d}


@pytest.mark.parametrize("kind", ["hash", "list", "string"])
def test_a_key_without_expiry_where_a_lease_goes_is_no_lease_and_is_replaced(kind, redis_server):
    """Every lease expires; a key without an expiry in a lease's place (planted, or set by hand) would hold every
    worker off for good (each waiting out its wait_s, then building anyway).  It is not a lease: the next worker
    to ask takes the lease over it, and a real lease is still respected."""
    cache = open_cache(redis_server.url())
    key = "cd" * 32
    lease = f"precompile:lease:{key}"
    r = redis_server.client()
    if kind == "string":
        r.set(lease, b"by hand")
    else:
        plant_type(r, lease, kind)
    assert r.pttl(lease) == -1 and not cache.lease_held(key)
    token = cache.acquire_lease(key, ttl_s=30)
    assert token and r.get(lease) == token.encode() and 0 < r.pttl(lease) <= 30_000 and cache.lease_held(key)
    assert cache.acquire_lease(key, ttl_s=30) is None  # a real lease holds
    assert cache.release_lease(key, token) and not cache.lease_held(key)


def test_the_cli_lists_and_verifies_a_redis_cache_with_wrong_typed_keys_and_names(redis_server):
    from _cli import cli

    cache = open_cache(redis_server.url())
    client = redis_server.client()
    d = cache.put_blob(b"{}")
    keys = [digest_bytes(bytes([i])) for i in range(3)]
    for k in keys:
        cache.set_ref(k, d)
    plant_type(client, f"precompile:ref:{keys[0]}", "hash")
    other = cache.put_blob(b"another blob")
    plant_type(client, f"precompile:blob:{{{other}}}", "list")
    client.set(b"precompile:ref:\xff", b"x")  # names no precompile writes: not UTF-8 (a traceback in ls, verify, gc)
    client.set(b"precompile:blob:{\xfe}", b"x")
    assert sorted(k for k, _ in cache.iter_refs()) == sorted(keys[1:]) and other not in [
        b.digest for b in cache.list_blobs()]
    for args in (["ls"], ["verify", "--json"], ["stats"], ["gc", "--dry-run", "--max-bytes", "1"]):
        proc = cli(*args, "--cache", redis_server.url(), check=False, timeout=10)
        assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr
        if args == ["ls"]:
            assert proc.returncode == 0 and keys[1][:16] in proc.stdout and keys[2][:16] in proc.stdout


@pytest.mark.parametrize("what", ["manifest", "binary", "ref"])
def test_a_wrong_typed_key_in_a_stored_artifact_costs_one_rebuild_then_hits(what, artifacts, redis_server):
    c = artifacts("make_fx")
    url = redis_server.url()
    client = redis_server.client()
    first = precompile.standalone_compile(c.gm, c.inputs, cache=url)
    assert_same_output(first(*c.inputs), c.expected)
    cache = open_cache(url)
    manifest = cache.get_ref(c.art.key)
    stored = json.loads(cache.get_blob(manifest))
    binary = next(iter(stored["kernels"][0]["binaries"].values()))
    target = {"manifest": f"precompile:blob:{{{manifest}}}", "binary": f"precompile:blob:{{{binary}}}",
              "ref": f"precompile:ref:{c.art.key}"}[what]
    plant_type(client, target, "hash")
    again = precompile.standalone_compile(c.gm, c.inputs, cache=url)
    assert again.outcome == "built", again.outcome  # a miss, rebuilt and stored again
    assert_same_output(again(*c.inputs), c.expected)
    assert key_type(client, target) in ("string", "none")  # replaced, or dropped (a rebuilt manifest has new bytes)
    hit = precompile.standalone_compile(c.gm, c.inputs, cache=url)
    assert hit.outcome == "hit", hit.outcome
    assert_same_output(hit(*c.inputs), c.expected)


# ------------------------------------------------------------------------------------------------------ local
def plant_node(path, kind: str, tmp_path) -> object:
    """Put a ``kind`` where ``path`` is; returns what must survive (a symlink's target), or None."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    outside = tmp_path / "outside.txt"
    if kind == "directory":
        path.mkdir()
        (path / "inner").mkdir()
        (path / "inner" / "file").write_bytes(b"x")
        os.symlink(outside, path / "link-out")  # removing the directory never follows it
    elif kind == "FIFO":
        os.mkfifo(path)
    elif kind == "socket":  # bound at a short path (AF_UNIX paths are short), then renamed into place
        short = os.path.join(tempfile.mkdtemp(dir="/tmp"), "s")
        s = socket.socket(socket.AF_UNIX)
        s.bind(short)
        s.close()
        os.rename(short, path)
        os.rmdir(os.path.dirname(short))
    elif kind == "symlink to /dev/zero":
        os.symlink("/dev/zero", path)
    elif kind == "symlink to a file outside":
        os.symlink(outside, path)
    outside.write_bytes(b"must survive")
    return outside


LOCAL_KINDS = ["directory", "FIFO", "socket", "symlink to /dev/zero", "symlink to a file outside"]


@pytest.mark.parametrize("kind", LOCAL_KINDS)
def test_a_local_blob_path_that_is_not_a_file_is_replaced_by_the_next_store(kind, tmp_path):
    cache = LocalCache(tmp_path / "c")
    data = b"blob bytes " * 100
    digest = digest_bytes(data)
    path = cache._blob_path(digest)
    outside = plant_node(path, kind, tmp_path)
    assert cache.put_blob(data) == digest
    assert path.is_file() and not path.is_symlink()
    assert cache.get_blob(digest) == data
    assert outside.read_bytes() == b"must survive"
    assert cache.counters()["errors"] == 1
    assert not [p for p in (tmp_path / "c" / "tmp").iterdir()]  # moved aside, then removed


@pytest.mark.parametrize("kind", LOCAL_KINDS)
def test_a_local_ref_path_that_is_not_a_file_is_replaced_by_the_next_store(kind, tmp_path):
    cache = LocalCache(tmp_path / "c")
    digest = cache.put_blob(b"manifest")
    key = digest_bytes(b"key")
    path = cache._ref_path(key)
    outside = plant_node(path, kind, tmp_path)
    cache.set_ref(key, digest)
    assert path.is_file() and cache.get_ref(key) == digest
    assert outside.read_bytes() == b"must survive"


def test_a_regular_blob_is_never_rewritten_and_a_read_only_cache_never_heals(tmp_path):
    cache = LocalCache(tmp_path / "c")
    data = b"stored once"
    digest = cache.put_blob(data)
    inode = os.stat(cache._blob_path(digest)).st_ino
    cache.put_blob(data)
    assert os.stat(cache._blob_path(digest)).st_ino == inode and cache.counters()["errors"] == 0
    other = b"another"
    path = cache._blob_path(digest_bytes(other))
    plant_node(path, "directory", tmp_path)
    reader = LocalCache(tmp_path / "c", read_only=True)
    with pytest.raises(CacheReadOnlyError):
        reader.put_blob(other)
    assert path.is_dir()


def test_a_local_ref_replaced_by_a_directory_costs_one_rebuild_then_hits(artifacts, tmp_path):
    c = artifacts("make_fx")
    url = f"file://{tmp_path / 'c'}"
    precompile.standalone_compile(c.gm, c.inputs, cache=url)
    path = LocalCache(tmp_path / "c")._ref_path(c.art.key)
    plant_node(path, "directory", tmp_path)
    again = precompile.standalone_compile(c.gm, c.inputs, cache=url)
    assert again.outcome == "built" and path.is_file()  # the store replaced the directory
    hit = precompile.standalone_compile(c.gm, c.inputs, cache=url)
    assert hit.outcome == "hit"
    assert_same_output(hit(*c.inputs), c.expected)
