"""get_or_build's lease protocol against a real redis-server, with plain functions as load and build (the
whole-model versions, with real workers and compiles, are in tests/store/test_fleet.py)."""

from __future__ import annotations

import threading
import time

import pytest

from cache_backends import open_cache
from cache_backends.local.cache import LocalCache
from precompile.store.coordination import get_or_build

KEY = "cd" * 32


def test_nobody_waits_past_the_deadline(redis_server):
    cache = open_cache(redis_server.url(lease_ttl=0.6, wait=0.8))
    holder = open_cache(redis_server.url())
    token = holder.acquire_lease(KEY, 0.6)
    stop = threading.Event()

    def renew_forever():  # a live builder that never finishes
        while not stop.wait(0.2):
            holder.renew_lease(KEY, token, 0.6)

    thread = threading.Thread(target=renew_forever)
    thread.start()
    try:
        start = time.monotonic()
        art, outcome = get_or_build(cache, KEY, lambda: None, lambda: "built here")
        waited = time.monotonic() - start
    finally:
        stop.set()
        thread.join()
    assert (art, outcome) == ("built here", "built") and 0.8 <= waited < 3


def test_lease_is_renewed_during_a_long_build_and_released_after(redis_server):
    cache = open_cache(redis_server.url(lease_ttl=0.6))
    other = open_cache(redis_server.url())
    seen_during_build = []

    def slow_build():
        for _ in range(4):  # 2 s: more than three lease lifetimes
            time.sleep(0.5)
            seen_during_build.append(other.acquire_lease(KEY) is None)
        return "artifact"

    assert get_or_build(cache, KEY, lambda: None, slow_build) == ("artifact", "built")
    assert seen_during_build == [True] * 4, "the lease lapsed while its holder was building"
    assert not redis_server.client().exists(f"precompile:lease:{KEY}")


def test_a_failed_build_releases_its_lease(redis_server):
    cache = open_cache(redis_server.url())

    def broken():
        raise RuntimeError("inductor failed")

    with pytest.raises(RuntimeError, match="inductor failed"):
        get_or_build(cache, KEY, lambda: None, broken)
    assert not cache.lease_held(KEY)


def test_waiter_gets_the_holders_artifact(redis_server):
    cache = open_cache(redis_server.url())
    holder = open_cache(redis_server.url())
    token = holder.acquire_lease(KEY)
    stored: list[str] = []

    def finish():
        time.sleep(0.5)
        stored.append("the artifact")
        holder.release_lease(KEY, token)

    threading.Thread(target=finish).start()
    art, outcome = get_or_build(cache, KEY, lambda: stored[0] if stored else None, lambda: "built twice")
    assert (art, outcome) == ("the artifact", "waited")
    assert cache.counters()["waits"] == 1 and cache.counters()["misses"] == 1


def test_no_lock_server_means_a_plain_local_build(tmp_path, redis_server):
    assert get_or_build(LocalCache(tmp_path / "c"), KEY, lambda: None, lambda: "local") == ("local", "built")
    port = redis_server.port
    redis_server.stop()
    down = open_cache(f"redis://127.0.0.1:{port}/0?timeout=0.5")
    start = time.monotonic()
    assert get_or_build(down, KEY, lambda: None, lambda: "local") == ("local", "built")
    assert time.monotonic() - start < 3
