"""Build leases in Redis (``P:lease:<artifact key>``): ``SET NX PX`` with a random token, renewed and released by
compare-and-set scripts, so that only the holder can extend or give back its lease.

A lease looks like what precompile writes: a string of :data:`TOKEN_HEX` lowercase hex characters with an expiry no
longer than the lease length (``lease_ttl``) of the worker looking at it.  Anything else under a lease key (a
string with a ten-year expiry or none, a hash, a token of another form: planted, or left by hand) is no lease: a
waiter does not wait for it, and the next worker to take the lease replaces it.  So one planted key costs the
fleet at most one lease length, never ``wait``.  Workers sharing a cache therefore use the same ``lease_ttl``: a
lease longer than a worker's own is replaced by it (a second build of that key, which is safe).
"""

from __future__ import annotations

import re
import secrets

from cache_backends.base import check_name
from cache_backends.redis.blobs import execute
from cache_backends.redis.failover import retrying

#: Length of a lease token, hex characters (``secrets.token_hex(16)``).
TOKEN_HEX = 32
_TOKEN = re.compile(rb"[0-9a-f]{%d}\Z" % TOKEN_HEX)

#: Compare-and-delete and compare-and-renew of a lease (the Redlock pattern for one instance,
#: https://redis.io/docs/latest/develop/use/patterns/distributed-locks/).
RELEASE_LUA = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
RENEW_LUA = ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) "
             "else return 0 end")
#: Take a lease (SET NX PX ARGV[2] ms), first deleting a key in its place that is no lease (see the module
#: docstring): not a string, not a token of :data:`TOKEN_HEX` lowercase hex, or without an expiry of at most ARGV[2]
#: ms.  One script, so that a real lease taken meanwhile is never deleted.  A key holding this call's own token
#: already (a first try whose reply was lost) is this call's lease.
ACQUIRE_LUA = (
    "local kind = redis.call('type', KEYS[1])['ok'] "
    "if kind ~= 'none' then "
    "  local lease = false "
    "  if kind == 'string' and redis.call('strlen', KEYS[1]) == %d then "
    "    local v = redis.call('get', KEYS[1]) "
    "    if v == ARGV[1] then redis.call('pexpire', KEYS[1], ARGV[2]) return 1 end "
    "    local ms = redis.call('pttl', KEYS[1]) "
    "    lease = ms > 0 and ms <= tonumber(ARGV[2]) and string.find(v, '^[0-9a-f]+$') ~= nil "
    "  end "
    "  if not lease then redis.call('del', KEYS[1]) end "
    "end "
    "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end return 0" % TOKEN_HEX)


def is_lease(value: object, pttl_ms: int, ttl_ms: int) -> bool:
    """Whether a lease key's value (bytes, or anything a pipeline answered) and its PTTL (ms; -1: no expiry, -2: no
    key) look like a lease precompile wrote with a lease length of ``ttl_ms`` milliseconds."""
    return isinstance(value, bytes) and bool(_TOKEN.match(value)) and 0 < pttl_ms <= ttl_ms


class LeasesMixin:
    """The lease methods of :class:`cache_backends.redis.cache.RedisCache` (which provides ``_talk``,
    ``_lease_key``, ``lease_ttl_s`` and the registered scripts ``_acquire``, ``_renew`` and ``_release``)."""

    def acquire_lease(self, key: str, ttl_s: float | None = None) -> str | None:
        """Try to take the build lease of artifact ``key`` for ``ttl_s`` seconds (default ``lease_ttl_s``):
        ``SET P:lease:<key> <token> NX PX <ttl>``, after deleting a key there that is no lease (see
        :data:`ACQUIRE_LUA`: not a token of precompile's form, or without an expiry of at most ``ttl``).

        Returns:
            the lease's random token if taken, None if another holder has it.

        Raises:
            CacheReadOnlyError: the cache is read-only (a read-only worker never builds for the fleet).
            CacheUnavailableError: Redis cannot be reached.
        """
        token = secrets.token_hex(16)  # one token for every try: a try whose reply was lost left this token there
        return token if self._acquire_as(check_name(key, "artifact key"), token, ttl_s) else None

    @retrying
    def _acquire_as(self, key: str, token: str, ttl_s: float | None) -> bool:
        ms = int((ttl_s or self.lease_ttl_s) * 1000)
        with self._talk(f"taking the build lease of {key[:12]}", write=True):
            return bool(self._acquire(keys=[self._lease_key(key)], args=[token, ms]))

    @retrying
    def renew_lease(self, key: str, token: str, ttl_s: float | None = None) -> bool:
        """Extend the lease to ``ttl_s`` from now if ``token`` still holds it (compare-and-PEXPIRE in Lua).

        Returns:
            False if the lease expired or another worker holds it now.

        Raises:
            CacheUnavailableError: Redis cannot be reached.
        """
        ms = int((ttl_s or self.lease_ttl_s) * 1000)
        with self._talk(f"renewing the build lease of {key[:12]}", write=True):
            return bool(self._renew(keys=[self._lease_key(key)], args=[token, ms]))

    @retrying
    def release_lease(self, key: str, token: str) -> bool:
        """Delete the lease if ``token`` still holds it (compare-and-delete in Lua); True if deleted.

        Raises:
            CacheUnavailableError: Redis cannot be reached.
        """
        with self._talk(f"releasing the build lease of {key[:12]}", write=True):
            return bool(self._release(keys=[self._lease_key(key)], args=[token]))

    @retrying
    def lease_held(self, key: str) -> bool:
        """True if some worker holds the build lease of ``key`` now: a token of precompile's form is there with an
        expiry of at most ``lease_ttl_s`` (one pipelined PTTL and bounded GETRANGE; reads).  Anything else there is
        no lease (:data:`ACQUIRE_LUA` replaces it), so a waiter never waits for it.

        Raises:
            CacheUnavailableError: Redis cannot be reached.
        """
        rkey = self._lease_key(check_name(key, "artifact key"))
        with self._talk(f"checking the build lease of {key[:12]}"):
            pipe = self.client.pipeline(transaction=False)
            pipe.pttl(rkey)
            pipe.getrange(rkey, 0, TOKEN_HEX)  # one byte more than a token: a longer value is no lease
            pttl, value = execute(pipe)
        return is_lease(value, int(pttl), int(self.lease_ttl_s * 1000))
