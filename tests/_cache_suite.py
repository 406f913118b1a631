"""The behaviours every cache backend has (``cache_backends.base.Cache``), as one suite run against each backend.

As dogpile.cache's ``_GenericBackendTestSuite``: :class:`CacheSuite` holds the tests, and a backend passes them by
one small test class that provides a ``backend`` fixture, a :class:`Backend` that opens caches of that kind on real
storage (a directory, a redis-server, a Redis Cluster with replicas, a directory in front of Redis), damages a
stored blob and takes its storage away for a while.  ``tests/cache_backends/test_conformance.py`` runs it over
every backend of this repository; a new backend (S3, say) is one module::

    class TestS3(CacheSuite):
        @pytest.fixture
        def backend(self, minio):
            return S3Backend(minio)

Capabilities a backend may lack are flags of :class:`Backend` (``leases``, ``evicts``, ``expires``): their tests are
skipped there, as the interface makes them optional.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from _local import KEY, KEY2, store_artifact  # store_artifact: blobs, a manifest naming them, the ref (any Cache)

from cache_backends import MISS, Cache, digest_bytes
from precompile.errors import CacheError, CacheReadOnlyError



class Backend:
    """How the suite opens and damages caches of one kind.  Subclasses set the flags and implement the methods.

    Every :meth:`open` of one instance opens the same storage (a directory, a key prefix), fresh for each test.
    """

    #: build leases (``supports_leases``): take, renew, release, expiry
    leases = True
    #: a lease is a lock its holder's process keeps (it ends when that process dies), not a key with an expiry
    leases_end_with_holder = False
    #: ``open(evict_bytes=N)`` caps the store at N bytes and evicts least recently used artifacts past it
    evicts = False
    #: ``open(ttl=S)``: everything expires S seconds after its last read or write
    expires = False
    #: with the storage taken away (:meth:`down`), blobs already stored still read (a near tier serves them)
    serves_when_down = False

    def open(self, *, read_only: bool = False, lease_ttl: float | None = None, evict_bytes: int | None = None,
             ttl: float | None = None) -> Cache:
        raise NotImplementedError

    def corrupt(self, cache: Cache, digest: str) -> None:
        """Flip a byte of blob ``digest`` where it is stored (every tier), so that it no longer hashes right."""
        raise NotImplementedError

    def plant(self, cache: Cache, digest: str, other: str) -> None:
        """Store, under blob ``digest``'s name (every tier), the stored copy of blob ``other`` (stored inline)."""
        raise NotImplementedError

    @contextmanager
    def down(self) -> Iterator[None]:
        """The storage is unreachable or stalled inside the block, back after it."""
        raise NotImplementedError
        yield


def only_cache_errors(call: Callable[[], object]) -> object:
    """``call()``'s value, or the :class:`CacheError` it raised; any other exception fails the test."""
    try:
        return call()
    except CacheError as err:
        return err


class CacheSuite:
    """The conformance tests; a subclass named ``Test...`` provides the ``backend`` fixture."""

    @pytest.fixture
    def cache(self, backend: Backend) -> Iterator[Cache]:
        c = backend.open()
        yield c
        c.close()

    # ------------------------------------------------------------------------------------------- blobs
    def test_blobs_round_trip_idempotently(self, cache):
        rng = __import__("random").Random(0)
        blobs = [b"", b"kernel source", b"def kernel(x):\n    return x * 2\n" * 400, os.urandom(300_000),
                 bytes(rng.choice(b"abcdefgh") for _ in range(200_000))]
        digests = [cache.put_blob(b) for b in blobs]
        assert digests == [digest_bytes(b) for b in blobs]
        puts = cache.counters()["puts"]
        assert cache.put_blob(blobs[3], digests[3]) == digests[3] and cache.counters()["puts"] == puts  # once
        missing = digest_bytes(b"never stored")
        assert cache.get_blobs([*digests, missing, digests[1]]) == {**dict(zip(digests, blobs)), missing: MISS}
        assert all(cache.get_blob(d) == b for d, b in zip(digests, blobs))
        assert cache.get_blob(missing) is MISS and not MISS

    def test_existence_checks(self, cache):
        d = cache.put_blob(b"part")
        missing = digest_bytes(b"absent")
        assert cache.has_blob(d) is True and cache.has_blob(missing) is False
        assert cache.has_blobs([d, missing, d]) == {d: True, missing: False}

    def test_bad_names_and_a_wrong_digest_are_value_errors(self, cache):
        for bad in ("abc", "G" * 64, "A" * 64, "0" * 63, "../" + "0" * 61):
            for call in (lambda: cache.get_blob(bad), lambda: cache.get_ref(bad), lambda: cache.has_blob(bad),
                         lambda: cache.set_ref(KEY, bad), lambda: cache.set_ref(bad, "0" * 64)):
                with pytest.raises(ValueError):
                    call()
        with pytest.raises(ValueError, match="hashes to"):
            cache.put_blob(b"data", "0" * 64)
        assert cache.has_blob(digest_bytes(b"data")) is False

    def test_a_corrupt_blob_is_a_counted_miss_and_is_dropped(self, backend, cache, caplog):
        data = os.urandom(20_000)
        good, d = cache.put_blob(b"an intact neighbour"), cache.put_blob(data)
        backend.corrupt(cache, d)
        errors = cache.counters()["errors"]
        with caplog.at_level(logging.WARNING, logger="precompile.cache"):
            assert cache.get_blobs([d, good]) == {d: MISS, good: b"an intact neighbour"}
        assert any(d[:12] in r.getMessage() for r in caplog.records), "the corrupt blob was not logged"
        assert cache.counters()["errors"] > errors
        assert cache.has_blob(d) is False, "the corrupt copy was kept"
        assert cache.put_blob(data) == d and cache.get_blob(d) == data  # the next store heals it

    def test_reads_are_bounded(self, cache):
        data = os.urandom(50_000)
        d = cache.put_blob(data)
        over = cache.counters().get("over_limit", 0)
        assert cache.get_blob(d, max_bytes=len(data) - 1) is MISS
        assert cache.get_blobs([d], {d: 1000}) == {d: MISS}
        assert cache.counters().get("over_limit", 0) - over == 2
        assert cache.has_blob(d) and cache.get_blob(d, max_bytes=len(data)) == data  # refused, never dropped

    def test_a_copy_refused_as_over_its_bound_is_rewritten_by_the_next_store(self, backend, cache):
        # what the digest names is 1000 bytes; the stored copy inflates far past that (damage, or a planted frame)
        data, other = os.urandom(1000), b"x" * 200_000
        d, o = cache.put_blob(data), cache.put_blob(other)
        backend.plant(cache, d, o)
        assert cache.get_blob(d, 1000) is MISS and cache.has_blob(d)  # refused, left in place
        assert cache.put_blob(data) == d  # the rebuild stores the blob again: this time it is rewritten
        assert cache.get_blob(d, 1000) == data

    # -------------------------------------------------------------------------------------------- refs
    def test_refs_set_replace_list_delete(self, cache):
        d1, d2 = cache.put_blob(b"one"), cache.put_blob(b"two")
        assert cache.get_ref(KEY) is MISS
        cache.set_ref(KEY, d1)
        cache.set_ref(KEY2, d2)
        assert cache.get_ref(KEY) == d1
        cache.set_ref(KEY, d2)
        assert cache.get_ref(KEY) == d2
        assert sorted(cache.iter_refs()) == sorted([(KEY, d2), (KEY2, d2)])
        assert cache.delete_ref(KEY) is True and cache.delete_ref(KEY) is False
        assert cache.get_ref(KEY) is MISS and list(cache.iter_refs()) == [(KEY2, d2)]

    def test_a_ref_is_deleted_with_a_digest_only_while_it_names_that_digest(self, cache):
        a, b = cache.put_blob(b"manifest a"), cache.put_blob(b"manifest b")
        cache.set_ref(KEY, b)  # a writer replaced the damaged manifest a reader found (a) with b
        assert cache.delete_ref(KEY, a) is False and cache.get_ref(KEY) == b
        assert cache.delete_ref(KEY, b) is True and cache.get_ref(KEY) is MISS
        assert cache.delete_ref(KEY, b) is False

    def test_a_stored_artifact_loads_and_runs(self, cache, artifacts):
        from conftest import assert_same_output

        import precompile
        from precompile.store.cache_io import store

        c = artifacts("make_fx")
        assert store(cache, c.art)
        art = precompile.load(c.art.key, cache=cache)
        assert_same_output(art(*c.inputs), c.expected)

    # ------------------------------------------------------------------------------------------ leases
    def test_leases_take_renew_release_expire(self, backend):
        if not backend.leases:
            cache = backend.open()
            assert not cache.supports_leases
            with pytest.raises(NotImplementedError):
                cache.acquire_lease(KEY)
            return
        if backend.leases_end_with_holder:
            self._leases_end_with_their_holder(backend)
            return
        # a's lease length is 5 s, b's 0.4 s: a lease is one only with an expiry within the reader's lease length
        a, b = backend.open(lease_ttl=5.0), backend.open(lease_ttl=0.4)
        assert a.supports_leases
        token = a.acquire_lease(KEY, 0.4)
        assert token and b.acquire_lease(KEY) is None and b.lease_held(KEY)
        assert not b.release_lease(KEY, "not-the-token") and a.lease_held(KEY)  # only the holder releases
        assert a.renew_lease(KEY, token, 5.0)
        time.sleep(0.6)
        assert a.lease_held(KEY), "a renewed lease expired at its first TTL"
        assert a.release_lease(KEY, token) and not a.lease_held(KEY)
        token_b = b.acquire_lease(KEY)
        assert token_b
        time.sleep(0.6)  # b died: its lease expires by itself, and a takes over
        assert not a.lease_held(KEY)
        token_a = a.acquire_lease(KEY)
        assert token_a and not b.renew_lease(KEY, token_b) and not b.release_lease(KEY, token_b)
        assert a.lease_held(KEY) and not b.lease_held(KEY)  # 5 s: longer than b's lease length, no lease to b
        assert a.release_lease(KEY, token_a)

    @staticmethod
    def _leases_end_with_their_holder(backend):
        import subprocess
        import sys

        from conftest import python_env

        a, b = backend.open(), backend.open()
        assert a.supports_leases and not a.lease_held(KEY)
        token = a.acquire_lease(KEY)
        assert token and b.acquire_lease(KEY) is None and b.lease_held(KEY) and a.acquire_lease(KEY) is None
        assert not b.release_lease(KEY, "not-the-token") and a.lease_held(KEY)  # only the holder releases
        assert a.renew_lease(KEY, token) and not b.renew_lease(KEY, token)
        assert a.release_lease(KEY, token) and not a.lease_held(KEY) and not a.renew_lease(KEY, token)
        assert not a.release_lease(KEY, token)  # given back once
        # a holder in another process, killed while it holds the lease (a builder OOM-killed): the lease ends
        # with it at once, with no expiry to wait out
        hold = ("import sys, time\nfrom cache_backends import open_cache\ncache = open_cache(sys.argv[1])\n"
                "print('held' if cache.acquire_lease(sys.argv[2]) else 'taken', flush=True)\ntime.sleep(300)\n")
        proc = subprocess.Popen([sys.executable, "-c", hold, backend.url(), KEY], stdout=subprocess.PIPE, text=True,
                                env=python_env())
        try:
            assert proc.stdout.readline().strip() == "held"
            assert a.lease_held(KEY) and a.acquire_lease(KEY) is None
            read_only = backend.open(read_only=True)
            assert read_only.lease_held(KEY)  # a read-only worker still sees whose build to wait for
            with pytest.raises(CacheReadOnlyError):
                read_only.acquire_lease(KEY)
        finally:
            proc.kill()
            proc.wait()
        assert not a.lease_held(KEY)
        token = a.acquire_lease(KEY)
        assert token and a.release_lease(KEY, token)

    # ---------------------------------------------------------------------------------------- counters
    def test_counters_are_shared_and_never_raise(self, backend, cache, caplog):
        cache.incr(hits=3, misses=1, builds=1)
        cache.incr(hits=1)
        with caplog.at_level(logging.WARNING, logger="precompile.cache"):
            cache.incr(bogus="not a number")  # logged, ignored
        other = backend.open()
        counters = other.counters()
        assert (counters["hits"], counters["misses"], counters["builds"]) == (4, 1, 1)
        stats = other.stats()
        assert stats["hit_rate"] == pytest.approx(0.8) and stats["url"] == other.url
        json.dumps(stats)

    # ---------------------------------------------------------------------------------------- read-only
    def test_read_only_reads_and_never_writes(self, backend, cache):
        mdigest, parts = store_artifact(cache, KEY, [b"part one", os.urandom(9000)])
        reader = backend.open(read_only=True)
        assert reader.read_only
        assert reader.get_ref(KEY) == mdigest and reader.get_blobs(parts)[parts[1]] is not MISS
        for write in (lambda: reader.put_blob(b"new"), lambda: reader.set_ref(KEY2, mdigest),
                      lambda: reader.delete_ref(KEY)):
            with pytest.raises(CacheReadOnlyError):
                write()
        reader.incr(hits=1)  # never raises
        assert list(cache.iter_refs()) == [(KEY, mdigest)] and not cache.has_blob(digest_bytes(b"new"))

    # --------------------------------------------------------------------------------- eviction, expiry
    def test_least_recently_used_artifacts_are_evicted_past_the_cap(self, backend):
        if not backend.evicts:
            pytest.skip("this backend does not evict by size")
        cache = backend.open(evict_bytes=40_000)
        keys = [digest_bytes(f"artifact {i}".encode()) for i in range(4)]
        stored = [store_artifact(cache, k, [os.urandom(8000), os.urandom(8000)]) for k in keys[:2]]
        assert cache.get_ref(keys[0]) == stored[0][0]  # artifact 0 is now more recent than artifact 1
        stored += [store_artifact(cache, k, [os.urandom(8000), os.urandom(8000)]) for k in keys[2:]]
        refs = dict(cache.iter_refs())
        assert keys[1] not in refs and keys[3] in refs, refs.keys()
        assert cache.counters()["evictions"] >= 1
        for key, (mdigest, parts) in zip(keys, stored):
            if key in refs:
                assert all(v is not MISS for v in cache.get_blobs([mdigest, *parts]).values())

    def test_entries_expire_unless_read(self, backend):
        if not backend.expires:
            pytest.skip("this backend has no expiry")
        cache = backend.open(ttl=1.5)
        mdigest, parts = store_artifact(cache, KEY, [os.urandom(5000)])
        kept, _ = store_artifact(cache, KEY2, [b"read often"])
        for _ in range(3):
            time.sleep(0.6)
            assert cache.get_ref(KEY2) == kept and cache.get_blob(kept) is not MISS
        assert cache.get_ref(KEY) is MISS and cache.get_blob(parts[0]) is MISS
        assert cache.get_ref(KEY2) == kept

    # ------------------------------------------------------------------------------------------ faults
    def test_storage_gone_is_a_miss_and_a_warning_never_an_exception(self, backend, artifacts, caplog):
        from precompile.store.cache_io import load_from_cache, store

        c = artifacts("make_fx")
        cache = backend.open()
        assert store(cache, c.art)
        blob = cache.put_blob(b"stored before")
        start = time.monotonic()
        with backend.down(), caplog.at_level(logging.WARNING):
            art = load_from_cache(c.art.key, cache)
            got = {name: only_cache_errors(call) for name, call in {
                "get_ref": lambda: cache.get_ref(KEY), "get_blob": lambda: cache.get_blob(blob),
                "has_blob": lambda: cache.has_blob(blob), "put_blob": lambda: cache.put_blob(os.urandom(100)),
                "set_ref": lambda: cache.set_ref(KEY, blob), "counters": cache.counters}.items()}
        assert time.monotonic() - start < 30, "a call hung on the storage that went away"
        if backend.serves_when_down:
            assert art is not None and got["get_blob"] == b"stored before"
        else:
            assert art is None
            assert any(r.levelno >= logging.WARNING for r in caplog.records), "the outage was not logged"
            assert got["get_blob"] is MISS or isinstance(got["get_blob"], CacheError)
        assert isinstance(got["counters"], dict)
        # back: the cache works again, and nothing stored before was damaged
        again = backend.open()
        deadline = time.monotonic() + 30
        # back means both paths: a blob may come back through a cluster's replicas while the masters (refs) are
        # still failing fast for the breaker's down_s
        while any(isinstance(only_cache_errors(read), CacheError)
                  for read in (lambda: again.get_blob(blob), lambda: again.get_ref(c.art.key))):
            assert time.monotonic() < deadline, "the cache did not come back"
            time.sleep(0.5)
            again = backend.open()
        assert again.get_blob(blob) == b"stored before"
        assert load_from_cache(c.art.key, again) is not None
