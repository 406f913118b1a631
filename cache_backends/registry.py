"""Open a cache from a URL string.  Backends register by scheme (dogpile's string-named backends).

A URL that cannot be right is an error, never a silent downgrade: a malformed URL, an unknown scheme, a bad
option or a relative path raises :class:`~precompile.errors.CacheURLError`.  ``open_cache(url, create=False)`` is
for commands that only read or tidy a cache: it never creates a directory, and :func:`probe` checks that every tier
answers before such a command reports on it.

This module knows URLs and backends only.  The default cache (``$PRECOMPILE_CACHE``) and the trust options a
precompile cache URL may carry (``verify_keys=``, ``signing_key=``) are precompile's: :mod:`precompile.store.opening`
reads them and hands the rest of the URL to :func:`open_cache`, which refuses them as unknown options.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from urllib.parse import unquote, urlsplit

from cache_backends.base import Cache
from cache_backends.redaction import redact_url, redacting
from precompile.errors import CacheError, CacheUnavailableError, CacheURLError

_BACKENDS: dict[str, Callable[[str], Cache]] = {}

#: A digest no blob has (sha256 of nothing is e3b0...; this one is all zeros): what :func:`probe` asks for.
_PROBE_DIGEST = "0" * 64


def register_backend(scheme: str, factory: Callable[[str], Cache]) -> None:
    """Make ``open_cache`` hand URLs of ``scheme`` (e.g. ``"file"``) to ``factory(url)``."""
    _BACKENDS[scheme.lower()] = factory


def _register_builtin() -> None:
    if "file" not in _BACKENDS:
        from cache_backends.local.cache import LocalCache

        register_backend("file", LocalCache.from_url)
    for scheme in ("redis", "rediss", "unix"):
        _BACKENDS.setdefault(scheme, _open_redis)


def _open_redis(url: str) -> Cache:
    from cache_backends.redis.cache import RedisCache  # imported on first use: file:// loads never import redis

    return RedisCache.from_url(url)


def open_cache(url: str | Cache | Sequence[str], *, create: bool = True) -> Cache:
    """Open the cache a URL names.

    Args:
        url: ``file:///abs/dir`` (an absolute path, or one starting with ``~``, is taken as ``file://``),
            ``redis://``/``rediss://``/``unix://`` (see :class:`cache_backends.redis.cache.RedisCache`), a tiered
            cache as two URLs joined by ``|`` or a list of two URLs (near tier first;
            :class:`cache_backends.tiered.TieredCache`), or an already open :class:`Cache` (returned as is).
            ``precompile.open_cache`` (:mod:`precompile.store.opening`) also takes None (``$PRECOMPILE_CACHE``,
            else the local default) and the trust options ``verify_keys=`` and ``signing_key=``.
        create: False for commands that read or tidy a cache: a local directory that does not exist is an error
            instead of a new, empty cache (nothing is created).  Remote tiers are not contacted here (see
            :func:`probe`).

    The cache's ``url`` and every error raised here (its message and the errors it was raised from) show the URL
    with its secrets masked (:mod:`cache_backends.redaction`); the URL as given is kept only to connect.

    Raises:
        CacheURLError: the URL is missing, malformed, relative, names a scheme no backend handles, or has a bad or
            unknown option.
        CacheUnavailableError: ``create`` is False and a local cache directory does not exist (or is not a
            directory); or a Redis Cluster cannot be reached to be opened.
    """
    if isinstance(url, Cache):
        return url
    with redacting(url):  # a message built from a raw option (a parser's echo, a library's error) too
        return _open(url, create)


def _open(url: str | Sequence[str], create: bool) -> Cache:
    if isinstance(url, str) and "|" in url:
        url = url.split("|")
    if isinstance(url, (list, tuple)):
        tiers = [u.strip() for u in url if isinstance(u, str) and u.strip()]
        if len(tiers) != 2 or len(tiers) != len(url):
            raise CacheURLError(f"a tiered cache takes exactly two URLs, near tier first (e.g. "
                                f"'file:///var/cache/precompile|redis://cache:6379/0'), got {redact_url(url)!r}")
        from cache_backends.tiered import TieredCache

        return TieredCache(_open(tiers[0], create), _open(tiers[1], create))
    if not isinstance(url, str) or not url.strip():
        raise CacheURLError(f"a cache URL must be a non-empty string such as 'file:///var/cache/precompile', "
                            f"got {redact_url(url)!r}")
    url = url.strip()
    _register_builtin()
    if "://" not in url:
        if not (url.startswith("/") or url.startswith("~")):
            raise CacheURLError(f"{redact_url(url)!r} is not a cache URL: use file:///absolute/dir (or an absolute "
                                "path), redis://host:6379/0, rediss://, unix:///path/redis.sock, or two of them "
                                "joined by |")
        url = "file://" + os.path.abspath(os.path.expanduser(url))
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError as err:  # "Invalid IPv6 URL"
        raise CacheURLError(f"malformed cache URL {redact_url(url)!r}: {err}") from None
    factory = _BACKENDS.get(scheme)
    if factory is None:
        known = ", ".join(sorted(f"{s}://" for s in _BACKENDS))
        raise CacheURLError(f"no cache backend handles {redact_url(scheme)}:// URLs (in {redact_url(url)!r}); "
                            f"known schemes: {known}")
    if not create and scheme == "file":
        from cache_backends.local.cache import LocalCache

        if factory == LocalCache.from_url:
            return LocalCache.from_url(url, create=False)
        _require_directory(url)
    return factory(url)


def _require_directory(url: str) -> None:
    """Raise unless the directory of a well-formed ``file://`` URL exists (a malformed one is left to the
    backend, whose error is better)."""
    parts = urlsplit(url)
    path = unquote(parts.path)
    if parts.netloc not in ("", "localhost") or not os.path.isabs(path):
        return
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        raise CacheUnavailableError(f"no cache at {redact_url(url)}: {path} {what} (nothing was created; a command "
                                    "that writes, such as warmup or import, creates it)")


def probe(cache: Cache) -> None:
    """Check that every tier of ``cache`` answers now: one existence check of a blob no cache holds.

    Commands that report on a cache (ls, stats, inspect, verify...) call it first, so that a Redis that is down
    is one clear error instead of an empty listing or zero counters.  A cache that was reachable and fails
    later still degrades to misses, as everywhere else.

    Raises:
        CacheUnavailableError: a tier cannot be reached (the message is the backend's, naming the server).
    """
    tiers = [getattr(cache, "local", None), getattr(cache, "remote", None)]
    if all(isinstance(t, Cache) for t in tiers):
        for tier in tiers:
            probe(tier)  # type: ignore[arg-type]
        return
    quiet = _Quiet()
    logger = logging.getLogger("precompile.cache")
    logger.addFilter(quiet)  # the error raised says it all: no warning line before it
    try:
        cache.has_blob(_PROBE_DIGEST)
    except CacheUnavailableError:
        raise
    except CacheError as err:
        raise CacheUnavailableError(f"cache {cache.url} cannot be used: {err}") from err
    finally:
        logger.removeFilter(quiet)


class _Quiet(logging.Filter):
    """Drops the records of the thread that installed it (the probe's own warnings)."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread
