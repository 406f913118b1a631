"""Cache backends behind one interface (:class:`cache_backends.base.Cache`), opened by URL.

>>> from cache_backends import open_cache
>>> cache = open_cache("file:///tmp/precompile-doctest")   # doctest: +SKIP

Schemes: ``file://DIR`` (:class:`cache_backends.local.LocalCache`).  Redis and tiered caches come next.
"""

from __future__ import annotations

from cache_backends.base import COUNTERS, MISS, Cache, check_name, digest_bytes, hit_rate
from cache_backends.registry import open_cache, register_backend

__all__ = ["COUNTERS", "MISS", "Cache", "check_name", "digest_bytes", "hit_rate", "open_cache", "register_backend"]
