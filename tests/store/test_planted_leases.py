"""A build lease planted by someone who can write the cache (issue 34, "Stalls"): a string or hash with a ten-year
expiry, or a value that is not a token precompile writes, under ``P:lease:<key>``.  Before, any key with an expiry
was a lease, and every worker that missed the key waited ``wait`` (600 s) for it.  Now only a token of
precompile's form with an expiry within the lease length is one: anything else is replaced by the next worker,
which builds under its own lease; a read-only worker does not wait for it.  A planted lease of the right form
costs at most its expiry, within one lease length.  Real redis-server; plain functions as load and build."""

from __future__ import annotations

import pytest

from cache_backends import open_cache
from cache_backends.local.cache import LocalCache
from precompile.store.coordination import get_or_build

KEY = "5e" * 32
LEASE = f"precompile:lease:{KEY}"
TEN_YEARS_S = 10 * 365 * 86400


def plant(r, case: str) -> None:
    """Put ``case``'s planted key under the lease of :data:`KEY`."""
    r.delete(LEASE)
    if case == "token_ten_years":  # a token of the right form, but an expiry no lease of ours has
        r.set(LEASE, "ab" * 16, ex=TEN_YEARS_S)
    elif case == "string_ten_years":
        r.set(LEASE, "held by hand", ex=TEN_YEARS_S)
    elif case == "hash_ten_years":
        r.hset(LEASE, "token", "ab" * 16)
        r.expire(LEASE, TEN_YEARS_S)
    elif case == "uppercase_token":  # a short expiry, but not a token precompile writes
        r.set(LEASE, "AB" * 16, px=20_000)
    elif case == "long_token":
        r.set(LEASE, "ab" * 32, px=20_000)
    else:
        raise AssertionError(case)


PLANTED = ["token_ten_years", "string_ten_years", "hash_ten_years", "uppercase_token", "long_token"]


@pytest.mark.parametrize("case", PLANTED)
def test_a_planted_lease_is_no_lease_and_is_replaced(case, redis_server):
    cache, r = open_cache(redis_server.url(lease_ttl=30)), redis_server.client()
    plant(r, case)
    assert not cache.lease_held(KEY)
    token = cache.acquire_lease(KEY)
    assert token and r.get(LEASE) == token.encode() and 0 < r.pttl(LEASE) <= 30_000
    assert cache.lease_held(KEY) and cache.acquire_lease(KEY) is None  # our own lease holds
    assert cache.release_lease(KEY, token) and not r.exists(LEASE)


def test_a_lease_of_the_right_form_is_respected(redis_server):
    cache, r = open_cache(redis_server.url(lease_ttl=30)), redis_server.client()
    r.set(LEASE, "0f" * 16, px=20_000)  # as another worker of the fleet writes it
    assert cache.lease_held(KEY) and cache.acquire_lease(KEY) is None
    assert r.get(LEASE) == b"0f" * 16
    # longer than this worker's lease length: no lease to it, though another worker's would hold it
    assert not open_cache(redis_server.url(lease_ttl=10)).lease_held(KEY)


def under_own_lease(r, cache):
    """A build that records what the lease key held while it ran."""
    seen = []

    def build() -> str:
        value, pttl = r.get(LEASE), r.pttl(LEASE)
        seen.append(value is not None and len(value) == 32 and value != b"ab" * 16 and 0 < pttl
                    <= cache.lease_ttl_s * 1000)
        return "built here"

    return build, seen


@pytest.mark.parametrize("case", PLANTED)
def test_a_worker_builds_at_once_under_its_own_lease_over_a_planted_one(case, redis_server):
    """``wait`` is 600 s: had the worker waited for the planted key, it would have built only after that, with the
    planted key still in place."""
    r = redis_server.client()
    cache = open_cache(redis_server.url(lease_ttl=5, wait=600))
    plant(r, case)
    build, seen = under_own_lease(r, cache)
    assert get_or_build(cache, KEY, lambda: None, build) == ("built here", "built")
    assert seen == [True] and not r.exists(LEASE)  # built under its own lease, released after


def test_a_read_only_worker_does_not_wait_for_a_planted_lease(redis_server):
    r = redis_server.client()
    plant(r, "string_ten_years")
    for url in (redis_server.url(read_only=1, wait=600),
                f"file://{redis_server.workdir / 'near'}|{redis_server.url(read_only=1, wait=600)}"):
        assert get_or_build(open_cache(url), KEY, lambda: None, lambda: "built here") == ("built here", "built")
    assert r.ttl(LEASE) > TEN_YEARS_S - 60  # a read-only worker replaces nothing


def test_a_planted_lease_of_the_right_form_costs_at_most_its_expiry(redis_server):
    r = redis_server.client()
    cache = open_cache(redis_server.url(lease_ttl=2, wait=600))
    r.set(LEASE, "ab" * 16, px=1500)  # within the lease length: a lease, waited for until it expires
    build, seen = under_own_lease(r, cache)
    assert get_or_build(cache, KEY, lambda: None, build) == ("built here", "takeover")
    assert seen == [True]


def test_a_local_cache_builds_at_once_when_nobody_holds_the_lease(tmp_path):
    cache = LocalCache(tmp_path)
    assert cache.supports_leases
    assert get_or_build(cache, KEY, lambda: None, lambda: "built here") == ("built here", "built")
    assert not cache.lease_held(KEY)  # given back after the build
