"""Open a cache from a URL string.  Backends register by scheme (dogpile's string-named backends)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from cache_backends.base import Cache
from precompile import config
from precompile.errors import CacheURLError, TrustConfigError

#: Query options every backend's URL may carry: keys of signed artifacts (:mod:`precompile.trust`).
TRUST_OPTIONS = ("verify_keys", "signing_key")

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
            ``$XDG_CACHE_HOME/precompile`` (``~/.cache/precompile``).  Any URL may carry ``verify_keys=``
            (comma-separated ``ed25519:<hex>`` public keys or key files) and ``signing_key=`` (a private key's
            path): see :mod:`precompile.trust`; a tiered cache uses its tiers' keys together.

    Raises:
        CacheURLError: the URL's scheme has no backend, the URL is malformed, or a key it names cannot be read.
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

        near, far = open_cache(tiers[0]), open_cache(tiers[1])
        tiered = TieredCache(near, far)
        tiered.verify_keys = near.verify_keys + far.verify_keys
        tiered.signing_key = near.signing_key or far.signing_key
        return tiered
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
    url, trust = _split_trust_options(url)
    cache = factory(url)
    if trust:
        cache.verify_keys = tuple(k for k in trust.get("verify_keys", "").split(",") if k.strip())
        cache.signing_key = trust.get("signing_key") or None
        cache.url += ("&" if "?" in cache.url else "?") + urlencode(trust)
    return cache


def _split_trust_options(url: str) -> tuple[str, dict[str, str]]:
    """``(url without the trust options, {option: value})``; the keys are read now, so a bad one fails here.

    Raises:
        CacheURLError: an option is given twice or names a key that cannot be read.
    """
    parts = urlsplit(url)
    if not any(name in parts.query for name in TRUST_OPTIONS):
        return url, {}
    try:
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=True)
    except ValueError as err:
        raise CacheURLError(f"malformed query in cache URL {url!r}: {err}") from err
    trust: dict[str, str] = {}
    for name, value in query:
        if name in TRUST_OPTIONS:
            if name in trust:
                raise CacheURLError(f"option {name!r} given twice in cache URL {url!r}")
            trust[name] = value
    from precompile import trust as trust_mod

    try:
        trust_mod.parse_verify_keys(trust.get("verify_keys", ""))
        if trust.get("signing_key"):
            trust_mod.load_signing_key(trust["signing_key"])
    except TrustConfigError as err:
        raise CacheURLError(f"cache URL option in {url!r}: {err}") from err
    rest = urlencode([(n, v) for n, v in query if n not in TRUST_OPTIONS])
    return urlunsplit((parts.scheme, parts.netloc, parts.path, rest, parts.fragment)), trust
