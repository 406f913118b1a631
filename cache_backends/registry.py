"""Open a cache from a URL string.  Backends register by scheme (dogpile's string-named backends)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from cache_backends.base import Cache
from precompile import config
from precompile.errors import CacheURLError

_BACKENDS: dict[str, Callable[[str], Cache]] = {}


def register_backend(scheme: str, factory: Callable[[str], Cache]) -> None:
    """Make ``open_cache`` hand URLs of ``scheme`` (e.g. ``"file"``) to ``factory(url)``."""
    _BACKENDS[scheme.lower()] = factory


def _register_builtin() -> None:
    if "file" not in _BACKENDS:
        from cache_backends.local import LocalCache

        register_backend("file", LocalCache.from_url)
    for scheme in ("redis", "rediss", "unix"):
        _BACKENDS.setdefault(scheme, _open_redis)


def _open_redis(url: str) -> Cache:
    from cache_backends.redis_cache import RedisCache  # imported on first use: file:// loads never import redis

    return RedisCache.from_url(url)


def open_cache(url: str | Cache | Sequence[str] | None = None) -> Cache:
    """Open the cache a URL names.

    Args:
        url: ``file:///abs/dir`` (a plain path is taken as ``file://``), ``redis://``/``rediss://``/``unix://``
            (see :class:`cache_backends.redis_cache.RedisCache`), a tiered cache as two URLs joined by ``|`` or
            a list of two URLs (near tier first; :class:`cache_backends.tiered.TieredCache`), an already open
            :class:`Cache` (returned as is), or None for ``$PRECOMPILE_CACHE``, else the embedded default
            ``$XDG_CACHE_HOME/precompile`` (``~/.cache/precompile``).

    Raises:
        CacheURLError: the URL's scheme has no backend, or the URL is malformed.
    """
    if isinstance(url, Cache):
        return url
    if url is None:
        url = config.default_cache_url()
    if isinstance(url, str) and "|" in url:
        url = url.split("|")
    if isinstance(url, (list, tuple)):
        tiers = [u.strip() for u in url if isinstance(u, str) and u.strip()]
        if len(tiers) != 2 or len(tiers) != len(url):
            raise CacheURLError(f"a tiered cache takes exactly two URLs, near tier first (e.g. "
                                f"'file:///var/cache/precompile|redis://cache:6379/0'), got {url!r}")
        from cache_backends.tiered import TieredCache

        return TieredCache(open_cache(tiers[0]), open_cache(tiers[1]))
    if not isinstance(url, str) or not url.strip():
        raise CacheURLError(f"a cache URL must be a non-empty string such as 'file:///var/cache/precompile', got {url!r}")
    url = url.strip()
    _register_builtin()
    scheme = urlsplit(url).scheme.lower() if "://" in url else "file"
    if scheme == "file" and "://" not in url:
        import os

        url = "file://" + os.path.abspath(os.path.expanduser(url))
    factory = _BACKENDS.get(scheme)
    if factory is None:
        known = ", ".join(sorted(f"{s}://" for s in _BACKENDS))
        raise CacheURLError(f"no cache backend handles {scheme}:// URLs (in {url!r}); known schemes: {known}")
    return factory(url)
