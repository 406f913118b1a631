"""An entry refused once is refused again without being read (issue 34, "Stalls"): a signed worker waiting for a
key whose ref names an unsigned, 4 MiB width-bomb manifest read and parsed it on every poll.  Now the refusal is
remembered per (key, manifest digest) under the same cache, keys and mode (precompile/store/refusals.py): the
manifest is read once, and counted once.  Shown by what the backends served and counted, with a real
redis-server for the waiting worker."""

from __future__ import annotations

import json

import pytest

from cache_backends import open_cache
from cache_backends.local.cache import LocalCache
from precompile.manifest import trust
from precompile.store.cache_io import load_from_cache
from precompile.store.coordination import get_or_build

KEY = "3c" * 32


def width_bomb(n: int = 1 << 20) -> bytes:
    """An unsigned manifest: a JSON object holding ``n`` small numbers (about 4n bytes, ~40n bytes parsed)."""
    return json.dumps({"schema": 2, "key": KEY, "blobs": [0] * n}).encode()


@pytest.fixture
def signed_worker(tmp_path, monkeypatch):
    monkeypatch.setenv("PRECOMPILE_VERIFY_KEYS", trust.generate_key(tmp_path / "builder.pem"))


def test_a_refused_manifest_is_read_once_per_ref(tmp_path, signed_worker):
    cache = LocalCache(tmp_path / "c")
    cache.set_ref(KEY, cache.put_blob(width_bomb()))
    assert load_from_cache(KEY, cache) is None
    once = cache.counters()
    assert once["untrusted"] == 1 and once["untrusted_unsigned"] == 1
    for _ in range(5):
        assert load_from_cache(KEY, LocalCache(tmp_path / "c")) is None  # a fresh cache each time, as callers open
    again = cache.counters()
    assert again["bytes_read"] == once["bytes_read"], "the refused manifest was read again"
    assert again["untrusted"] == 1
    # a new ref (another manifest) is read and refused on its own
    cache.set_ref(KEY, cache.put_blob(width_bomb(1000)))
    assert load_from_cache(KEY, cache) is None
    assert cache.counters()["untrusted"] == 2


def test_a_recalled_refusal_is_the_same_miss_as_the_first(tmp_path, signed_worker):
    """The lookup a remembered refusal answers misses for the reason the first one did (``untrusted``), not as an
    absent entry: the hit-rate dashboard's misses by reason would otherwise move from one to the other."""
    from precompile import metrics

    cache = LocalCache(tmp_path / "c")
    cache.set_ref(KEY, cache.put_blob(width_bomb(1000)))
    metrics.take_miss_reason()
    reasons = []
    for _ in range(2):
        assert load_from_cache(KEY, cache) is None
        reasons.append(metrics.take_miss_reason())
    assert reasons == ["untrusted", "untrusted"]


def test_a_refusal_holds_only_for_its_keys_and_mode(tmp_path, signed_worker, monkeypatch):
    cache = LocalCache(tmp_path / "c")
    cache.set_ref(KEY, cache.put_blob(width_bomb(1000)))
    assert load_from_cache(KEY, cache) is None and cache.counters()["untrusted"] == 1
    monkeypatch.setenv("PRECOMPILE_VERIFY_KEYS", trust.generate_key(tmp_path / "other.pem"))
    assert load_from_cache(KEY, cache) is None and cache.counters()["untrusted"] == 2  # other keys: checked again
    monkeypatch.delenv("PRECOMPILE_VERIFY_KEYS")
    before = cache.counters()["bytes_read"]
    assert load_from_cache(KEY, cache) is None  # no keys: read, and then malformed (no such manifest)
    assert cache.counters()["bytes_read"] > before


def test_a_signed_worker_waiting_on_a_planted_entry_parses_it_once(redis_server, signed_worker):
    """The key's lease is held (as a real builder holds it, expiring in 2 s), its ref names an unsigned width bomb:
    the worker polls until the lease expires, then builds; the manifest was refused, read and counted, once."""
    r = redis_server.client()
    cache = open_cache(redis_server.url(lease_ttl=5, wait=600))
    cache.set_ref(KEY, cache.put_blob(width_bomb()))
    r.set(f"precompile:lease:{KEY}", "0f" * 16, px=2000)
    polls = []

    def load():
        polls.append(1)
        return load_from_cache(KEY, cache)

    assert get_or_build(cache, KEY, load, lambda: "built here") == ("built here", "takeover")
    counters = cache.counters()
    assert len(polls) > 3 and counters["untrusted"] == 1, (len(polls), counters)
