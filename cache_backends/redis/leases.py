"""Build leases in Redis (``P:lease:<artifact key>``): ``SET NX PX`` with a random token, renewed and released by
compare-and-set scripts, so that only the holder can extend or give back its lease."""

from __future__ import annotations

import secrets

from cache_backends.base import check_name
from cache_backends.redis.failover import retrying

#: Compare-and-delete and compare-and-renew of a lease (the Redlock pattern for one instance,
#: https://redis.io/docs/latest/develop/use/patterns/distributed-locks/).
RELEASE_LUA = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
RENEW_LUA = ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) "
             "else return 0 end")
#: Take a lease (SET NX PX), first deleting a key in its place that no lease can be: every lease expires, so a key
#: without an expiry (PTTL -1: a hash or list planted there, a string set by hand) would hold every worker off for
#: good.  One script, so that a real lease taken meanwhile is never deleted.
#: A key holding this call's own token already (a first try whose reply was lost) is this call's lease.
ACQUIRE_LUA = ("if redis.call('pttl', KEYS[1]) == -1 then redis.call('del', KEYS[1]) end "
               "if redis.call('type', KEYS[1])['ok'] == 'string' and redis.call('get', KEYS[1]) == ARGV[1] then "
               "redis.call('pexpire', KEYS[1], ARGV[2]) return 1 end "
               "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end return 0")


class LeasesMixin:
    """The lease methods of :class:`cache_backends.redis.cache.RedisCache` (which provides ``_talk``,
    ``_lease_key``, ``lease_ttl_s`` and the registered scripts ``_acquire``, ``_renew`` and ``_release``)."""

    def acquire_lease(self, key: str, ttl_s: float | None = None) -> str | None:
        """Try to take the build lease of artifact ``key``: ``SET P:lease:<key> <token> NX PX <ttl>``, after
        deleting a key there that has no expiry (not a lease: see :data:`ACQUIRE_LUA`).

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
        """True if some worker holds the build lease of ``key`` now: a key with an expiry is there (one PTTL; a
        read).  A key without one is no lease (:data:`ACQUIRE_LUA` deletes it).

        Raises:
            CacheUnavailableError: Redis cannot be reached.
        """
        with self._talk(f"checking the build lease of {key[:12]}"):
            return int(self.client.pttl(self._lease_key(check_name(key, "artifact key")))) >= 0
