"""The local-disk backend (``file://DIR``): :class:`cache_backends.local.cache.LocalCache`.

Modules, one concern each: :mod:`.cache` (the cache: refs, blobs, the interface), :mod:`.files` (atomic
writes, bounded reads, the directory layout), :mod:`.fetch` (per-host fetch locks for the near tier),
:mod:`.leases` (build leases: each key built once among the processes sharing the directory),
:mod:`.counters` (the stats file), :mod:`.heal` (dropping damaged entries), :mod:`.upkeep` (listing, size, LRU
eviction), :mod:`.beneath` (every file opened below the root without following a link) and :mod:`.url` (the URL's
options).

May import: the backends' shared modules (:mod:`cache_backends.base`, :mod:`cache_backends.bounded`,
:mod:`cache_backends.options`), :mod:`precompile.errors` and :mod:`precompile.config`; never the Redis backend,
the tiered one or the opener (:mod:`cache_backends.registry`).
"""
