"""TieredCache: a local directory in front of a real redis-server.  Read-through with backfill, write-through,
and a remote that is down, stalled or returns garbage never fails a call or costs more than a miss."""

from __future__ import annotations

import logging
import os
import shutil
import time

import pytest
from conftest import assert_same_output

import precompile
from cache_backends import MISS, open_cache
from cache_backends.local.cache import LocalCache
from cache_backends.tiered import TieredCache
from precompile.errors import CacheURLError
from precompile.store.cache_io import store


def tiered_url(tmp_path, redis_server, **options) -> str:
    return f"file://{tmp_path / 'near'}|{redis_server.url(**options)}"


def test_open_cache_takes_a_pair_of_urls(tmp_path, redis_server):
    url = tiered_url(tmp_path, redis_server)
    cache = open_cache(url)
    assert isinstance(cache, TieredCache) and cache.url == url
    assert isinstance(open_cache([f"file://{tmp_path}/a", redis_server.url()]), TieredCache)
    with pytest.raises(CacheURLError, match="exactly two"):
        open_cache(f"file://{tmp_path}/a|{redis_server.url()}|file://{tmp_path}/b")
    with pytest.raises(CacheURLError, match="exactly two"):
        open_cache(f"file://{tmp_path}/a|")


def test_read_through_backfills_everything_then_serves_without_the_remote(artifacts, tmp_path, redis_server):
    c = artifacts("dynamo")
    assert store(open_cache(redis_server.url()), c.art)  # another machine built it into Redis
    cache = open_cache(tiered_url(tmp_path, redis_server))
    art = precompile.load(c.art.key, cache=cache)
    assert_same_output(art(*c.inputs), c.expected)
    near = LocalCache(tmp_path / "near")
    assert near.get_ref(c.art.key) == open_cache(redis_server.url()).get_ref(c.art.key)
    assert all(near.has_blob(d) for d in c.art.manifest.blobs), "backfill left parts behind"
    assert near.verify()["ok"]
    redis_server.stop()  # the remote is gone: the near tier alone serves the artifact, whole
    again = precompile.load(c.art.key, cache=open_cache(tiered_url(tmp_path, redis_server)))
    assert_same_output(again(*c.inputs), c.expected)
    art = precompile.standalone_compile(c.gm, c.inputs, cache=tiered_url(tmp_path, redis_server))
    assert art.outcome == "hit"


def test_write_through_reaches_both_tiers(artifacts, tmp_path, redis_server):
    c = artifacts("make_fx")
    cache = open_cache(tiered_url(tmp_path, redis_server))
    assert store(cache, c.art)
    digest = LocalCache(tmp_path / "near").get_ref(c.art.key)
    assert digest is not MISS and open_cache(redis_server.url()).get_ref(c.art.key) == digest
    # another machine, with an empty near tier, gets it from Redis: a hit, no compile
    other = f"file://{tmp_path / 'other'}|{redis_server.url()}"
    art = precompile.standalone_compile(c.gm, c.inputs, cache=other)
    assert art.outcome == "hit"
    assert_same_output(art(*c.inputs), c.expected)
    counters = open_cache(redis_server.url()).counters()
    assert counters["hits"] == 1 and counters["builds"] == 0  # fleet-wide counters in Redis


def test_remote_down_warns_once_counts_and_serves_local(artifacts, tmp_path, redis_server, caplog):
    c = artifacts("dynamo")
    port = redis_server.port
    redis_server.stop()
    url = f"file://{tmp_path / 'near'}|redis://127.0.0.1:{port}/0?timeout=1"
    cache = open_cache(url)
    with caplog.at_level(logging.WARNING, logger="precompile"):
        assert store(cache, c.art)  # the local write is enough
        for _ in range(3):
            assert cache.get_ref("0" * 64) is MISS
        art = precompile.load(c.art.key, cache=cache)
    assert_same_output(art(*c.inputs), c.expected)
    remote_warnings = [r for r in caplog.records if "remote cache" in r.getMessage()]
    assert len(remote_warnings) == 1, [r.getMessage() for r in remote_warnings]
    assert cache.remote_errors >= 4
    assert LocalCache(tmp_path / "near").counters()["remote_errors"] == cache.remote_errors


def test_remote_stalled_costs_one_timeout(artifacts, tmp_path, redis_server):
    c = artifacts("dynamo")
    cache = open_cache(tiered_url(tmp_path, redis_server, timeout=1))
    assert store(cache, c.art)
    redis_server.pause()  # SIGSTOP: connections open, no answers
    try:
        start = time.monotonic()
        for i in range(5):
            assert cache.get_ref(f"{i:064x}") is MISS  # local misses ask the remote: one timeout, then fail fast
        art = precompile.load(c.art.key, cache=cache)
        assert_same_output(art(*c.inputs), c.expected)
        assert time.monotonic() - start < 6
    finally:
        redis_server.resume()


def test_remote_garbage_is_a_miss_and_never_reaches_the_near_tier(artifacts, tmp_path, redis_server):
    c = artifacts("dynamo")
    remote = open_cache(redis_server.url())
    assert store(remote, c.art)
    client = redis_server.client()
    for key in client.keys("precompile:blob:*"):  # every stored part now holds garbage
        client.set(key, b"PCB1Z" + b"\x28\xb5\x2f\xfd" + b"garbage" * 10)
    cache = open_cache(tiered_url(tmp_path, redis_server))
    assert cache.get_ref(c.art.key) is not MISS  # the ref itself is fine...
    assert precompile.store.cache_io.load_from_cache(c.art.key, cache) is None  # ...but nothing it names is
    near = LocalCache(tmp_path / "near")
    assert near.get_ref(c.art.key) is MISS and near.verify()["ok"]
    assert not any(near.has_blob(d) for d in c.art.manifest.blobs)
    assert remote.counters()["errors"] >= 1


def test_a_damaged_near_entry_never_deletes_the_remote_ref_to_a_good_one(artifacts, tmp_path, redis_server):
    """A near tier's ref naming a manifest neither tier holds (planted, or left by an eviction after the fleet
    rebuilt) is dropped from the near tier only: the fleet's good ref in Redis stays (it was deleted too, so every
    worker of the fleet missed and rebuilt)."""
    from precompile.store.cache_io import load_from_cache

    c = artifacts("dynamo")
    remote = open_cache(redis_server.url())
    assert store(remote, c.art)
    good = remote.get_ref(c.art.key)
    LocalCache(tmp_path / "near").set_ref(c.art.key, "ab" * 32)
    url = tiered_url(tmp_path, redis_server)
    assert load_from_cache(c.art.key, url) is None  # the near entry is damaged: a miss, its ref dropped
    assert remote.get_ref(c.art.key) == good and LocalCache(tmp_path / "near").get_ref(c.art.key) is MISS
    art = load_from_cache(c.art.key, url)  # the next load reads the remote's, and backfills it
    assert_same_output(art(*c.inputs), c.expected)


def test_read_only_remote_waits_for_the_fleets_build(artifacts, tmp_path, redis_server):
    """A serving worker (read-only towards Redis) that misses while a builder holds the lease waits for its
    artifact instead of compiling; no compile runs in this process."""
    import threading

    c = artifacts("dynamo")
    builder = open_cache(redis_server.url())
    token = builder.acquire_lease(c.art.key)
    assert token

    def finish_build():
        time.sleep(1.5)
        store(builder, c.art)
        builder.release_lease(c.art.key, token)

    thread = threading.Thread(target=finish_build)
    thread.start()
    start = time.monotonic()
    art = precompile.standalone_compile(c.gm, c.inputs, cache=tiered_url(tmp_path, redis_server, read_only=1))
    thread.join()
    assert art.outcome == "waited" and time.monotonic() - start >= 1.4
    assert_same_output(art(*c.inputs), c.expected)
    assert LocalCache(tmp_path / "near").get_ref(c.art.key) is not MISS  # kept on this machine too


# ------------------------------------------------------------------------------- one download per host
FETCH_SNIPPET = r"""
import json, os, sys, time
from pathlib import Path
from cache_backends import open_cache
url, go, digests = sys.argv[1], Path(sys.argv[2]), sys.argv[3].split(",")
cache = open_cache(url)
while not go.exists():
    time.sleep(0.002)
got = cache.get_blobs(digests)
print(json.dumps({d: v.hex()[:16] if v else None for d, v in got.items()}))
"""


def test_workers_of_one_host_fetch_each_blob_from_redis_once(tmp_path, redis_server):
    """Six processes behind one near directory miss the same twelve blobs at the same moment: Redis serves each
    blob once (its bytes_read grows by one copy's), the local tier counts twelve remote fetches, and every process
    gets every blob whole."""
    from conftest import spawn_python

    remote = open_cache(redis_server.url(chunk_size="64KiB"))
    blobs = [os.urandom(200_000) for _ in range(12)]  # chunked: 4 chunks each
    digests = [remote.put_blob(b) for b in blobs]
    before = remote.counters()["bytes_read"]
    assert remote.get_blobs(digests) == dict(zip(digests, blobs))
    one_copy = remote.counters()["bytes_read"] - before
    go = tmp_path / "go"
    url = f"file://{tmp_path / 'near'}?fetch_wait=60|{redis_server.url(chunk_size='64KiB')}"
    procs = [spawn_python(FETCH_SNIPPET, url, str(go), ",".join(digests), timeout=120) for _ in range(6)]
    time.sleep(1.0)  # let them import and open the cache
    go.touch()
    reports = [p.json() for p in procs]
    want = {d: b.hex()[:16] for d, b in zip(digests, blobs)}
    assert all(r == want for r in reports), "a process got wrong or missing blobs"
    near = LocalCache(tmp_path / "near").counters()
    assert near["remote_blobs"] == 12, near
    assert remote.counters()["bytes_read"] - before == 2 * one_copy, "Redis served some blob twice to one host"
    assert near["near_waits"] + near["remote_blobs"] <= 6 * 12


FETCH_HOLDER = r"""
import sys, time
from cache_backends.local.cache import LocalCache
with LocalCache(sys.argv[1]).fetch_lock(sys.argv[2].split(",")):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_stuck_fetch_lock_holder_costs_the_wait_bound_and_a_killed_one_nothing(tmp_path, redis_server, caplog):
    """A process of the host holds the fetch lock and never fetches (stuck): a reader waits ``fetch_wait`` seconds,
    then fetches the blob itself.  Killed with SIGKILL, it holds nothing (the kernel drops its flock): the next
    reader fetches at once."""
    import signal
    import subprocess
    import sys

    from conftest import python_env

    remote = open_cache(redis_server.url())
    data = os.urandom(5000)
    digest = remote.put_blob(data)
    near = tmp_path / "near"
    LocalCache(near)
    holder = subprocess.Popen([sys.executable, "-c", FETCH_HOLDER, str(near), digest], stdout=subprocess.PIPE,
                              text=True, env=python_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        cache = open_cache(f"file://{near}?fetch_wait=0.5|{redis_server.url()}")
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="precompile.cache"):
            assert cache.get_blob(digest) == data
        assert time.monotonic() - start < 5, "the wait for a stuck holder is not bounded"
        assert any("fetching them here as well" in r.getMessage() for r in caplog.records)
        LocalCache(near)._blob_path(digest).unlink()  # as if never fetched
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        caplog.clear()
        cache = open_cache(f"file://{near}?fetch_wait=60|{redis_server.url()}")
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="precompile.cache"):
            assert cache.get_blob(digest) == data
        assert time.monotonic() - start < 5, "a killed holder still blocks the others"
        assert not any("fetching them here as well" in r.getMessage() for r in caplog.records)
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_a_near_hit_takes_no_fetch_lock(tmp_path, redis_server):
    cache = open_cache(f"file://{tmp_path / 'near'}|{redis_server.url()}")
    digest = open_cache(redis_server.url()).put_blob(b"part")
    assert cache.get_blob(digest) == b"part"  # fetched under the lock, backfilled
    locks = tmp_path / "near" / "locks" / "fetch"
    assert locks.is_dir()
    shutil.rmtree(locks)
    assert cache.get_blobs([digest]) == {digest: b"part"}
    assert not locks.exists(), "a blob the near tier has was read under the fetch lock"
