"""RedisCache against real redis-server processes, what only Redis does: the stored format (chunked, raw or zstd,
> 512 MiB), TTL refresh, read-only mode and an ACL user that may only read, unix sockets, TLS, cluster slots, and a
server that is gone or stalled.  What every backend does is in the conformance suite (test_conformance.py)."""

from __future__ import annotations

import logging
import os
import random
import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache_backends import MISS, digest_bytes, open_cache
from cache_backends.redis.cache import RedisCache
from cache_backends.redis.health import FLUSH_INTERVAL_S
from precompile.errors import CacheReadOnlyError, CacheUnavailableError, CacheURLError

KEY = "ab" * 32


def test_how_blobs_and_refs_are_stored(redis_server):
    """The stored format (round trips, refs, leases and counters are in the conformance suite)."""
    cache = open_cache(redis_server.url(chunk_size="1KiB"))
    assert isinstance(cache, RedisCache)
    small, big = b"kernel source", os.urandom(10_000)  # random: stays > 1 KiB compressed, so it is chunked
    d_small, d_big = cache.put_blob(small), cache.put_blob(big)
    assert cache.put_blob(big) == d_big  # idempotent: counted once
    r = redis_server.client()
    assert r.exists(f"precompile:blob:{{{d_big}}}:9") and not r.exists(f"precompile:blob:{{{d_small}}}:0")
    # zstd where it pays, raw where it does not (random bytes): the head says which
    d_text = cache.put_blob(b"def kernel(x):\n    return x * 2\n" * 400)
    assert r.getrange(f"precompile:blob:{{{d_text}}}", 0, 4) == b"PCB1Z"
    assert r.getrange(f"precompile:blob:{{{d_big}}}", 0, 4) == b"PCB1K"
    assert r.getrange(f"precompile:blob:{{{d_small}}}", 0, 4) == b"PCB1R"
    assert cache.get_blobs([d_small, d_big]) == {d_small: small, d_big: big}
    rng = random.Random(0)
    compressible = bytes(rng.choice(b"abcdefgh") for _ in range(20_000))  # 3 bits a byte: zstd frame > 1 KiB
    d_comp = cache.put_blob(compressible)
    assert r.exists(f"precompile:blob:{{{d_comp}}}:1")
    assert r.getrange(f"precompile:blob:{{{d_comp}}}", 0, 4) == b"PCB1C"  # chunks of a zstd frame
    assert cache.get_blob(d_comp) == compressible
    cache.set_ref(KEY, d_big)
    assert r.get(f"precompile:ref:{KEY}") == d_big.encode()
    other = open_cache(redis_server.url(chunk_size="1KiB")).counters()  # counters live in Redis
    assert other["puts"] == 4 and other["bytes_written"] > 10_000 and other["bytes_read"] > 10_000


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=6000), chunk=st.integers(min_value=16, max_value=2048), noise=st.booleans())
def test_any_bytes_round_trip_at_any_chunk_size(redis_server, data, chunk, noise):
    if noise:
        data = data + os.urandom(len(data))  # incompressible half: many chunks
    cache = open_cache(redis_server.url(chunk_size=chunk, prefix=f"h{chunk}"))
    digest = cache.put_blob(data)
    assert cache.get_blob(digest) == data


def test_flipped_byte_and_missing_chunk_are_misses_and_dropped(redis_server):
    cache = open_cache(redis_server.url(chunk_size=256))
    r = redis_server.client()
    a, b = os.urandom(3000), os.urandom(3000)
    da, db = cache.put_blob(a), cache.put_blob(b)
    r.setrange(f"precompile:blob:{{{da}}}:3", 17, b"\xff\x00")  # flip bytes inside one chunk
    r.delete(f"precompile:blob:{{{db}}}:5")  # a chunk evicted by maxmemory, say
    before = cache.counters()["errors"]
    assert cache.get_blobs([da, db]) == {da: MISS, db: MISS}
    assert cache.counters()["errors"] - before == 2
    # dropped, head and chunks: the next writer stores it whole again
    assert not r.exists(f"precompile:blob:{{{da}}}") and not r.keys(f"precompile:blob:{{{da}}}:*")
    assert not cache.has_blob(db)
    assert cache.put_blob(a) == da and cache.get_blob(da) == a
    # a garbled head and a ref that is not a digest: misses, counted, dropped
    r.set(f"precompile:blob:{{{db}}}", b"garbage")
    r.set(f"precompile:ref:{KEY}", b"not a digest")
    assert cache.get_blob(db) is MISS and cache.get_ref(KEY) is MISS
    assert not r.exists(f"precompile:ref:{KEY}") and cache.counters()["errors"] - before == 4


def test_ttl_is_set_and_refreshed_on_hit(redis_server):
    cache = open_cache(redis_server.url(ttl=30, chunk_size=256))
    r = redis_server.client()
    digest = cache.put_blob(os.urandom(1000))
    cache.set_ref(KEY, digest)
    keys = [f"precompile:ref:{KEY}", f"precompile:blob:{{{digest}}}", f"precompile:blob:{{{digest}}}:0"]
    for k in keys:
        assert 0 < r.pttl(k) <= 30_000
        r.pexpire(k, 5_000)  # as if 25 s had passed
    assert cache.get_ref(KEY) == digest and cache.get_blob(digest) is not MISS
    for k in keys:
        assert r.pttl(k) > 25_000, k  # a hit refreshed every key it read
    # so does an existence check (a load checks the parts it does not read), chunks included
    for k in keys[1:]:
        r.pexpire(k, 5_000)
    assert cache.has_blobs([digest, "0" * 64]) == {digest: True, "0" * 64: False}
    for k in keys[1:]:
        assert r.pttl(k) > 25_000, k
    # a second put of the same blob refreshes it too (a writer keeps what it is about to reference alive)
    r.pexpire(keys[1], 5_000)
    cache.put_blob(cache.get_blob(digest))
    assert r.pttl(keys[1]) > 25_000


def test_read_only_url_never_writes(redis_server, caplog):
    writer = open_cache(redis_server.url())
    digest = writer.put_blob(b"artifact part")
    writer.set_ref(KEY, digest)
    assert writer.flush()  # its counters are sent off the call path: let them land before the snapshot
    r = redis_server.client()
    before = sorted(r.keys("*"))
    reader = open_cache(redis_server.url(read_only=1, ttl=60))
    assert reader.read_only and reader.get_ref(KEY) == digest and reader.get_blob(digest) == b"artifact part"
    for write in (lambda: reader.put_blob(b"x"), lambda: reader.set_ref(KEY, digest), lambda: reader.delete_ref(KEY),
                  lambda: reader.acquire_lease(KEY)):
        with pytest.raises(CacheReadOnlyError, match="read-only"):
            write()
    with pytest.raises(CacheReadOnlyError, match=r"^not writing blob \w+: Redis cache .* is read-only \(it was opened"):
        reader.put_blob(b"x")
    reader.incr(hits=1)  # kept in memory
    r.set(f"precompile:ref:{'cd' * 32}", b"garbage")  # a read-only reader does not even drop garbage
    r.set(f"precompile:blob:{{{'ef' * 32}}}", b"garbage")
    with caplog.at_level(logging.WARNING, logger="precompile"):
        assert reader.get_ref("cd" * 32) is MISS and reader.get_blob("ef" * 32) is MISS
    said = [rec.getMessage() for rec in caplog.records]
    assert len(said) == 2 and all("a miss, left in place (read-only cache)" in m for m in said), said
    assert sorted(r.keys("*")) == sorted([*before, *(f"precompile:{k}".encode() for k in
                                                     (f"ref:{'cd' * 32}", f"blob:{{{'ef' * 32}}}"))])
    assert r.pttl(f"precompile:ref:{KEY}") == -1  # no TTL refresh either
    assert reader.counters()["hits"] == 1 and r.hget("precompile:counters", "hits") is None


def test_acl_user_with_read_commands_only(redis_server):
    admin = redis_server.client()
    admin.execute_command("ACL", "SETUSER", "worker", "on", ">s3cret", "~precompile:*", "+@read", "+@connection")
    writer = open_cache(redis_server.url())
    digest = writer.put_blob(b"compiled kernel")
    writer.set_ref(KEY, digest)
    url = f"redis://worker:s3cret@127.0.0.1:{redis_server.port}/0"
    cache = open_cache(url)
    assert "s3cret" not in cache.url and "worker:***@" in cache.url
    assert cache.get_ref(KEY) == digest and cache.get_blob(digest) == b"compiled kernel"
    # its first write (the read counters, sent off the call path; flush() waits for them) got NOPERM from the
    # server: the cache turned read-only, with a warning
    cache.flush()
    assert cache.read_only
    with pytest.raises(CacheReadOnlyError):
        cache.put_blob(b"new")
    with pytest.raises(CacheReadOnlyError):
        cache.set_ref(KEY, digest)
    assert cache.lease_held(KEY) is False  # EXISTS is a read: a read-only worker can still see builds
    # a serving worker that counts its hits in the fleet's hit rate: read-only, plus HINCRBY on the counters key only
    admin.execute_command("ACL", "SETUSER", "counted", "on", ">pw2", "~precompile:*", "+@read", "+@connection",
                          "(~precompile:counters +hincrby)")
    counted = open_cache(f"redis://counted:pw2@127.0.0.1:{redis_server.port}/0?read_only=1&counters=1")
    assert counted.get_ref(KEY) == digest
    counted.incr(hits=1)
    assert counted.flush()
    assert int(admin.hget("precompile:counters", "hits")) == 1
    with pytest.raises(CacheReadOnlyError):
        counted.put_blob(b"new")
    with pytest.raises(CacheUnavailableError, match="credentials"):
        open_cache(f"redis://worker:wrong@127.0.0.1:{redis_server.port}/0").get_ref(KEY)


def test_unix_socket_database_and_prefix(redis_server):
    cache = open_cache(f"unix://{redis_server.sock}?db=3&prefix=fleet-a")
    digest = cache.put_blob(b"on db 3")
    cache.set_ref(KEY, digest)
    assert redis_server.client(db=3).get(f"fleet-a:ref:{KEY}") == digest.encode()
    assert redis_server.client(db=0).dbsize() == 0
    assert open_cache(f"unix://{redis_server.sock}?db=3&prefix=fleet-b").get_ref(KEY) is MISS


@pytest.mark.parametrize("url, match", [
    ("redis://127.0.0.1:6379/0?chunk_size=0", "chunk_size"),
    ("redis://127.0.0.1:6379/0?ttl=-1", "ttl"),
    ("redis://127.0.0.1:6379/0?prefix=a{b}", "prefix"),
    ("redis://127.0.0.1:6379/0?bogus=1", "unknown option 'bogus'"),
    ("redis://127.0.0.1:6379/0?ttl=1&ttl=2", "twice"),
    # every number finite and bounded (1e999 and 1e306 overflowed an int, a millisecond count or a timeval)
    ("redis://127.0.0.1:6379/0?chunk_size=1e999", r"chunk_size= must be a size in bytes from 1 to 536870912"),
    ("redis://127.0.0.1:6379/0?chunk_size=1GiB", r"chunk_size= .* \(512 MiB\)"),
    ("redis://127.0.0.1:6379/0?ttl=1e306", r"ttl= must be a number of seconds > 0 and at most 315360000"),
    ("redis://127.0.0.1:6379/0?timeout=1e306", r"timeout= .* at most 3600 \(1 hour\)"),
    ("redis://127.0.0.1:6379/0?lease_ttl=nan", "lease_ttl="),
    ("redis://127.0.0.1:6379/0?wait=inf", r"wait= .* at most 86400 \(1 day\)"),
    ("redis://127.0.0.1:6379/0?down_s=1e306", "down_s="),
    ("redis://127.0.0.1:6379/0?retry_s=-1", "retry_s="),
    ("redis://127.0.0.1:6379/0?level=23", "zstd level from -131072 to 22"),
    ("redis://127.0.0.1:6379/0?socket_timeout=1e306", "socket_timeout="),  # redis-py's own, checked too
    ("redis://127.0.0.1:6379/0?health_check_interval=1e999", "health_check_interval="),
    ("redis://127.0.0.1:6379/0?ssl_cert_reqs=none", r"'ssl_cert_reqs' .* needs a rediss:// URL"),
    ("unix:///run/redis.sock?ssl_ca_certs=/x", "needs a rediss:// URL"),
    ("redis:///0", "names no host"),
    ("unix:///run/redis.sock?cluster=1", "cluster=1 needs"),
    ("unix://127.0.0.1:6379", "names no socket path"),
])
def test_bad_urls_are_rejected_before_any_connection(url, match):
    with pytest.raises(CacheURLError, match=match):
        open_cache(url)


def test_unreachable_and_stalled_servers_fail_fast(redis_server):
    dead = open_cache(f"redis://127.0.0.1:{redis_server.port + 1}/0?timeout=1")
    start = time.monotonic()
    with pytest.raises(CacheUnavailableError):
        dead.get_ref(KEY)
    with pytest.raises(CacheUnavailableError, match="not retrying"):  # the breaker: no second connect attempt
        dead.get_blob(KEY)
    assert time.monotonic() - start < 5
    cache = open_cache(redis_server.url(timeout=1))
    digest = cache.put_blob(b"x")
    redis_server.pause()
    try:
        start = time.monotonic()
        with pytest.raises(CacheUnavailableError):
            cache.get_blob(digest)
        with pytest.raises(CacheUnavailableError, match="not retrying"):
            cache.get_ref(KEY)
        assert time.monotonic() - start < 6  # one socket timeout (plus one retry), then fail fast
        cache.incr(hits=1)  # never raises
        assert cache.counters()["hits"] == 1
    finally:
        redis_server.resume()


def test_close_sends_queued_counts_and_then_leaves_the_server_alone(redis_server, monkeypatch):
    cache = open_cache(redis_server.url())
    other = open_cache(redis_server.url())  # another open cache of the same server: it keeps counting
    cache.incr(hits=3)
    other.close()
    cache.incr(hits=1)
    assert cache.counters()["hits"] == 4
    cache.incr(hits=2)
    cache.close()  # sends what is queued: another worker sees it
    reader = open_cache(redis_server.url())
    assert reader.counters()["hits"] == 6
    reader.close()
    port = redis_server.port
    redis_server.stop()
    attempts = []
    real_connect = socket.socket.connect

    def watch(sock, address, *args, **kwargs):
        if isinstance(address, tuple) and address[1] == port:
            attempts.append(address)
        return real_connect(sock, address, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", watch)
    cache.incr(misses=1)  # every cache closed: kept in this process, never sent to the gone server
    time.sleep(10 * FLUSH_INTERVAL_S)
    assert attempts == [] and cache.counters()["misses"] == 1


def test_blob_larger_than_redis_string_limit(redis_server):
    """600 MiB of incompressible bytes: more than one Redis string may hold (512 MiB), stored as chunks."""
    cache = open_cache(redis_server.url(chunk_size="8MiB"))
    data = os.urandom(600 << 20)
    digest = cache.put_blob(data)
    r = redis_server.client()
    assert r.exists(f"precompile:blob:{{{digest}}}:74") and r.getrange(f"precompile:blob:{{{digest}}}", 0, 4) == b"PCB1K"
    got = cache.get_blob(digest)
    assert len(got) == len(data) and digest_bytes(got) == digest
    del data, got


# --------------------------------------------------------------------------------------------- cluster
def test_cluster_keeps_each_chunked_blob_on_one_slot(redis_cluster):
    """With ``spread=0`` (the chunked layout) a blob's head and chunks share one slot; the spread layout, the default
    on a cluster, is test_redis_spread.py's."""
    cache = open_cache(redis_cluster.url(chunk_size=512, prefix="slots", spread=0))
    assert cache.cluster and not cache.spread
    blobs = [os.urandom(3000) for _ in range(12)]
    digests = [cache.put_blob(b) for b in blobs]
    for i, d in enumerate(digests):
        cache.set_ref(digest_bytes(str(i).encode()), d)
    client = cache.client
    nodes = set()
    for d in digests:
        keys = [f"slots:blob:{{{d}}}"] + [f"slots:blob:{{{d}}}:{i}" for i in range(6)]
        assert all(client.exists(k) for k in keys) and not client.exists(f"slots:spread:{{{d}}}")
        slots = {client.keyslot(k) for k in keys}
        assert len(slots) == 1, f"blob {d[:12]} spans slots {slots}"
        nodes.add(client.get_node_from_key(keys[0]).name)
    assert len(nodes) >= 2, "12 blobs all landed on one of 3 masters"
    assert cache.get_blobs(digests) == dict(zip(digests, blobs))  # pipelined across nodes
    assert len(dict(cache.iter_refs())) == 12  # SCAN on every master
    token = cache.acquire_lease(KEY)
    assert token and cache.acquire_lease(KEY) is None and cache.release_lease(KEY, token)
    cache.incr(hits=3)
    assert open_cache(redis_cluster.url(prefix="slots")).counters()["hits"] == 3


def test_tls_with_a_verified_certificate(tmp_path):
    from _redis import RedisServer

    server = RedisServer(tmp_path / "tls", tls=True).start()
    try:
        cache = open_cache(f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={server.tls_ca}&chunk_size=1KiB")
        data = os.urandom(5000)
        digest = cache.put_blob(data)
        assert cache.get_blob(digest) == data
        # the same port in plain text, or TLS with a CA that did not sign the certificate: unavailable, not a hang
        plain = open_cache(f"redis://127.0.0.1:{server.port}/0?timeout=1")
        with pytest.raises(CacheUnavailableError):
            plain.get_blob(digest)
        wrong_ca = open_cache(f"rediss://127.0.0.1:{server.port}/0?timeout=1")  # system CAs only
        with pytest.raises(CacheUnavailableError):
            wrong_ca.get_blob(digest)
    finally:
        server.stop()


