"""Cache backends behind one interface (:class:`cache_backends.base.Cache`), opened by URL.

>>> from cache_backends import open_cache
>>> cache = open_cache("file:///tmp/precompile-doctest")   # doctest: +SKIP

Schemes: ``file://DIR`` (:class:`cache_backends.local.cache.LocalCache`), ``redis://``, ``rediss://``, ``unix://``
(:class:`cache_backends.redis.cache.RedisCache`) and two URLs joined by ``|``
(:class:`cache_backends.tiered.TieredCache`).

May import: :mod:`precompile.errors` and :mod:`precompile.config`, nothing else of precompile (docs/architecture.md).
The opener, :mod:`cache_backends.registry`, is imported on first use of :func:`open_cache` or
:func:`register_backend`, not with this package.  A precompile cache URL's trust options and the default cache
are precompile's (:mod:`precompile.store.opening`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cache_backends.base import COUNTERS, MISS, Cache, check_name, digest_bytes, hit_rate

__all__ = ["COUNTERS", "MISS", "Cache", "check_name", "digest_bytes", "hit_rate", "open_cache", "register_backend"]

if TYPE_CHECKING:  # pragma: no cover
    from cache_backends.registry import open_cache, register_backend


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"open_cache", "register_backend"})


def __getattr__(name: str) -> Any:
    if name not in ("open_cache", "register_backend"):
        raise AttributeError(f"module 'cache_backends' has no attribute {name!r}")
    value = getattr(importlib.import_module("cache_backends.registry"), name)
    globals()[name] = value
    return value
