"""The Redis backend (``redis://``, ``rediss://``, ``unix://``, Redis Cluster):
:class:`cache_backends.redis.cache.RedisCache`.

Modules, one concern each: :mod:`.cache` (the cache and its interface), :mod:`.blobs` (blob reads),
:mod:`.writes` (blob writes, and deleting or refreshing a blob's parts), :mod:`.codec` (the stored byte format of a
blob, whole, chunked or spread), :mod:`.spread` (which slots a spread blob's pieces go to), :mod:`.counters`
(fleet-wide stats),
:mod:`.leases` (build leases: ``SET NX PX`` and compare-and-delete), :mod:`.health` (the circuit breaker per
server), :mod:`.failover` (retries through a failover), :mod:`.opening` (building a cluster client while nodes stall: one
timeout per node), :mod:`.replicas` (reads from replicas), :mod:`.upkeep` (listing, TTL, eviction) and :mod:`.url`
(the URL's options, TLS and ACL).

May import: redis-py, the backends' shared modules (:mod:`cache_backends.base`, :mod:`cache_backends.bounded`,
:mod:`cache_backends.options`), :mod:`precompile.errors` and :mod:`precompile.config`; never the local backend,
the tiered one or the opener (:mod:`cache_backends.registry`).
"""
