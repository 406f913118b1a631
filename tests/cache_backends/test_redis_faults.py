"""Redis faults, for real (issue 10, findings 5-8): a garbled chunk count, a stalled server behind a local tier,
one timeout then fail-fast, and a transient error during a load, each against a real redis-server and, where a
worker is involved, in a real process."""

from __future__ import annotations

import time

import pytest
from conftest import assert_same_output, spawn_python

import precompile
from cache_backends.local.cache import LocalCache

# ------------------------------------------------------------------- Redis faults (issue 10, findings 5-8)
HITS_SNIPPET = r"""
import json, logging, sys, time, torch, precompile, _graphs
logging.basicConfig(level=logging.WARNING, format="LOG %(levelname)s %(name)s %(message)s")
url, n, pause_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
model = _graphs.mlp()
gm, inputs = _graphs.graph("make_fx", model)
with torch.no_grad():
    want = gm(*inputs)
out = []
for i in range(n):
    if i:
        time.sleep(pause_s)
    start = time.monotonic()
    art = precompile.standalone_compile(gm, inputs, cache=url)
    got = art(*inputs)
    out.append({"s": time.monotonic() - start, "source": art.source,
                "ok": all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want))})
print(json.dumps(out))
"""


def _flip_chunked_heads(client) -> int:
    """Flip the top bit of the chunk count and of the stored length of every chunked head; returns how many."""
    import struct

    n = 0
    for key in client.keys("precompile:blob:*"):
        head = client.get(key)
        if head and head[:5] in (b"PCB1C", b"PCB1K") and len(head) == 17:
            count, total = struct.unpack_from("<IQ", head, 5)
            client.set(key, head[:5] + struct.pack("<IQ", count ^ (1 << 31), total ^ (1 << 40)))
            n += 1
    return n


def test_flipped_chunk_count_is_a_miss_not_a_memory_error(artifacts, redis_server):
    """Finding 5: a bit flipped in a chunked head's count (and length) used to make get_blob build a list of
    two billion batches (MemoryError, worker exit 1).  Now: a miss, the blob dropped, a rebuild, in a real
    process, fast."""
    c = artifacts("make_fx")
    url = redis_server.url(chunk_size="4KiB")
    from precompile.store.cache_io import store

    assert store(precompile.open_cache(url), c.art)
    assert _flip_chunked_heads(redis_server.client()) >= 1
    proc = spawn_python(HITS_SNIPPET, url, "2", "0")
    first, second = proc.json()
    assert first["ok"] and second["ok"], (first, second)
    assert first["source"] == "compiled" and second["source"] == "cache"  # rebuilt once, then served
    assert "dropping it" in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr[-3000:]
    counters = precompile.open_cache(url).counters()
    assert counters["errors"] >= 1 and counters["builds"] == 1, counters


def test_stalled_redis_never_slows_a_local_hit(artifacts, tmp_path, redis_server):
    """Finding 6: with counters=1 (deploy/serving-worker.yaml), a hit served by the near tier used to send its
    counters to Redis on the call path: two timeouts per hit once the breaker had expired.  Counters now go off
    the call path: every hit is as fast with Redis SIGSTOPped as without."""
    c = artifacts("make_fx")
    from precompile.store.cache_io import store

    assert store(precompile.open_cache(f"file://{tmp_path / 'near'}|{redis_server.url()}"), c.art)
    url = f"file://{tmp_path / 'near'}|{redis_server.url(read_only=1, counters=1, timeout=2, down_s=1)}"
    redis_server.pause()
    try:
        proc = spawn_python(HITS_SNIPPET, url, "4", "1.5")
        hits = proc.json()
    finally:
        redis_server.resume()
    assert all(h["ok"] and h["source"] == "cache" for h in hits), hits
    # none waits for Redis (one timeout is 2 s; the first hit also pays the first fast load's set-up)
    assert max(h["s"] for h in hits[1:]) < 1.0 and hits[0]["s"] < 2.0, [round(h["s"], 3) for h in hits]


def test_stalled_redis_costs_one_timeout_then_is_skipped(redis_server):
    """Finding 7: redis-py retried a timed-out command, so a stalled server cost two timeouts.  Now one, and
    every cache of the process on that server then fails fast while it is down."""
    from cache_backends.redis.cache import RedisCache
    from precompile.errors import CacheUnavailableError

    url = redis_server.url(timeout=1, down_s=30)
    digest = precompile.open_cache(url).put_blob(b"part")
    redis_server.pause()
    try:
        start = time.monotonic()
        with pytest.raises(CacheUnavailableError, match="Timeout"):
            precompile.open_cache(url).get_blob(digest)
        one = time.monotonic() - start
        start = time.monotonic()
        with pytest.raises(CacheUnavailableError, match="not retrying"):
            RedisCache.from_url(url).get_ref("0" * 64)  # a new cache of the same server: skipped
        skipped = time.monotonic() - start
    finally:
        redis_server.resume()
    assert 0.9 < one < 1.6, one
    assert skipped < 0.1, skipped


def test_transient_remote_error_during_a_load_drops_nothing(artifacts, tmp_path, redis_server):
    """Finding 8: a remote read that timed out used to look like a missing part, and the load then deleted the
    intact remote ref for the whole fleet.  Now it is a miss (one timeout, counted), and both refs stay."""
    from precompile.store.cache_io import load_from_cache, store

    c = artifacts("make_fx")
    url = f"file://{tmp_path / 'near'}|{redis_server.url(timeout=1, down_s=0)}"
    assert store(precompile.open_cache(url), c.art)
    near = LocalCache(tmp_path / "near")
    needed = c.art.manifest.load_digests()[0]
    near._blob_path(needed).unlink()  # evicted here: the load must read it from Redis
    redis_server.pause()
    try:
        start = time.monotonic()
        assert load_from_cache(c.art.key, url) is None
        took = time.monotonic() - start
    finally:
        redis_server.resume()
    assert took < 1.6, took
    assert redis_server.client().exists(f"precompile:ref:{c.art.key}"), "the remote ref was dropped"
    assert near.get_ref(c.art.key), "the near ref was dropped"
    assert near.counters()["errors"] >= 1 and near.counters()["remote_errors"] >= 1
    art = load_from_cache(c.art.key, url)  # Redis answers again: a hit, the part fetched again
    assert art is not None
    assert_same_output(art(*c.inputs), c.expected)
