"""Open a cache from a URL string.  Backends register by scheme (dogpile's string-named backends).

A URL that cannot be right is an error, never a silent downgrade: a malformed URL, an unknown scheme, a bad
option or a relative path raises :class:`~precompile.errors.CacheURLError` (and names ``PRECOMPILE_CACHE`` when
the URL came from it).  ``open_cache(url, create=False)`` is for commands that only read or tidy a cache: it
never creates a directory, and :func:`probe` checks that every tier answers before such a command reports on it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from cache_backends.base import Cache
from cache_backends.bounded import MAX_MANIFEST_BYTES, loads_json
from cache_backends.redaction import redact_url, redacting
from precompile import config
from precompile.errors import CacheError, CacheUnavailableError, CacheURLError, TrustConfigError

if TYPE_CHECKING:  # pragma: no cover
    from precompile.artifact.trust import Policy

#: Query options every backend's URL may carry: keys of signed artifacts (:mod:`precompile.artifact.trust`).
TRUST_OPTIONS = ("verify_keys", "signing_key")

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


def open_cache(url: str | Cache | Sequence[str] | None = None, *, create: bool = True) -> Cache:
    """Open the cache a URL names.

    Args:
        url: ``file:///abs/dir`` (an absolute path, or one starting with ``~``, is taken as ``file://``),
            ``redis://``/``rediss://``/``unix://`` (see :class:`cache_backends.redis.cache.RedisCache`), a tiered
            cache as two URLs joined by ``|`` or a list of two URLs (near tier first;
            :class:`cache_backends.tiered.TieredCache`), an already open :class:`Cache` (returned as is), or
            None for ``$PRECOMPILE_CACHE``, else the embedded default ``$XDG_CACHE_HOME/precompile``
            (``~/.cache/precompile``).  Any URL may carry ``verify_keys=`` (comma-separated ``ed25519:<hex>``
            public keys or key files) and ``signing_key=`` (a private key's path): see :mod:`precompile.artifact.trust`;
            a tiered cache uses its tiers' keys together.
        create: False for commands that read or tidy a cache: a local directory that does not exist is an error
            instead of a new, empty cache (nothing is created).  Remote tiers are not contacted here (see
            :func:`probe`).

    The cache's ``url`` and every error raised here (its message and the errors it was raised from) show the URL
    with its secrets masked (:mod:`cache_backends.redaction`); the URL as given is kept only to connect.

    Raises:
        CacheURLError: the URL is malformed, relative, names a scheme no backend handles, or has a bad option.
        TrustConfigError: a ``verify_keys=`` or ``signing_key=`` option (of any tier) names a key that cannot be
            read, or names none.
        CacheUnavailableError: ``create`` is False and a local cache directory does not exist (or is not a
            directory); or a Redis Cluster cannot be reached to be opened.
    """
    if isinstance(url, Cache):
        return url
    if url is None:
        url = config.default_cache_url()
        if os.environ.get("PRECOMPILE_CACHE", "").strip():
            with redacting(url):
                try:
                    return _open(url, create)
                except CacheURLError as err:
                    raise CacheURLError(f"PRECOMPILE_CACHE: {err}") from err
                except TrustConfigError as err:
                    raise TrustConfigError(f"PRECOMPILE_CACHE: {err}") from err
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

        near, far = _open(tiers[0], create), _open(tiers[1], create)
        tiered = TieredCache(near, far, refuses=refused_by_trust)
        tiered.verify_keys = near.verify_keys + far.verify_keys
        tiered.signing_key = near.signing_key or far.signing_key
        return tiered
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
    url, trust = _split_trust_options(url)
    if not create and scheme == "file":
        from cache_backends.local.cache import LocalCache

        if factory == LocalCache.from_url:
            cache = LocalCache.from_url(url, create=False)
        else:
            _require_directory(url)
            cache = factory(url)
    else:
        cache = factory(url)
    if trust:
        cache.verify_keys = tuple(k.strip() for k in trust.get("verify_keys", "").split(",") if k.strip())
        cache.signing_key = trust["signing_key"].strip() if "signing_key" in trust else None
        cache.url += ("&" if "?" in cache.url else "?") + urlencode(trust)
    return cache


def policy_for(cache: str | Cache | Sequence[str] | None = None) -> Policy:
    """The trust policy of one call (:func:`precompile.artifact.trust.resolve`): the environment's settings plus the
    keys of the cache or URL in hand, every tier's, whatever path the call then takes (a file, an unpacked
    directory, a bundle, a cache entry).  A URL is not opened: nothing is created, no server is contacted; only its
    trust options are read (and checked).

    Args:
        cache: an open cache, a URL or two (as :func:`open_cache` takes), or None for ``$PRECOMPILE_CACHE`` (the
            embedded default carries no keys).

    Raises:
        CacheURLError: the URL's query is malformed or gives a trust option twice; ``cache`` is not a URL.
        TrustConfigError: a key setting (the environment's or the URL's) cannot be read or names no key.
        ConfigError: ``PRECOMPILE_REQUIRE_NO_HOST_CODE`` holds a value precompile does not accept.
    """
    from precompile.artifact import trust

    if isinstance(cache, Cache):
        return trust.policy(cache)
    keys: list[str] = []
    signers: list[str] = []
    from_env = cache is None and bool(os.environ.get("PRECOMPILE_CACHE", "").strip())
    url = config.default_cache_url() if cache is None else cache
    with redacting(url):
        try:
            for tier in _tier_urls(url):
                options = _split_trust_options(tier)[1]
                keys.extend(k.strip() for k in options.get("verify_keys", "").split(",") if k.strip())
                if options.get("signing_key", "").strip():
                    signers.append(options["signing_key"].strip())
        except (CacheURLError, TrustConfigError) as err:
            if from_env:
                raise type(err)(f"PRECOMPILE_CACHE: {err}") from err
            raise
    return trust.resolve(tuple(keys), signers[0] if signers else None)  # the near tier's signer first, as _open


def _tier_urls(url: str | Sequence[str]) -> list[str]:
    """The URLs of each tier of ``url`` (one, or two joined by ``|`` or in a list), a bare path as ``file://``.

    Raises:
        CacheURLError: ``url`` is not a string or a list of strings.
    """
    tiers = url.split("|") if isinstance(url, str) else list(url) if isinstance(url, (list, tuple)) else None
    if tiers is None or not all(isinstance(t, str) for t in tiers):
        raise CacheURLError(f"a cache URL must be a string such as 'file:///var/cache/precompile', got "
                            f"{redact_url(url)!r}")
    return [t.strip() if "://" in t else "file://" + t.strip() for t in tiers if t.strip()]


def _split_trust_options(url: str) -> tuple[str, dict[str, str]]:
    """``(url without the trust options, {option: value})``; the keys are read now, so a bad one fails here.

    Raises:
        CacheURLError: the query is malformed or an option is given twice.
        TrustConfigError: an option names a key that cannot be read, or names none (``verify_keys=``,
            ``verify_keys=,``, ``signing_key=``, a key file that is empty): a key option never turns checking off.
    """
    try:
        parts = urlsplit(url)
    except ValueError as err:  # "Invalid IPv6 URL"
        raise CacheURLError(f"malformed cache URL {redact_url(url)!r}: {err}") from None
    if not any(name in parts.query for name in TRUST_OPTIONS):
        return url, {}
    try:
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=True)
    except ValueError as err:
        raise CacheURLError(f"malformed query in cache URL {redact_url(url)!r}: {err}") from err
    trust: dict[str, str] = {}
    for name, value in query:
        if name in TRUST_OPTIONS:
            if name in trust:
                raise CacheURLError(f"option {name!r} given twice in cache URL {redact_url(url)!r}")
            trust[name] = value
    from precompile.artifact import trust as trust_mod

    where = redact_url(urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")))
    if "verify_keys" in trust:
        trust_mod.parse_verify_keys(trust["verify_keys"], f"verify_keys= of cache URL {where}")
    if "signing_key" in trust:
        try:
            trust_mod.load_signing_key(trust["signing_key"])
        except TrustConfigError as err:
            raise TrustConfigError(f"signing_key= of cache URL {where}: {err}") from err
    rest = urlencode([(n, v) for n, v in query if n not in TRUST_OPTIONS])
    return urlunsplit((parts.scheme, parts.netloc, parts.path, rest, parts.fragment)), trust


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


def refused_by_trust(cache: Cache, manifest: bytes) -> bool:
    """Whether the verify keys configured for ``cache`` (``PRECOMPILE_VERIFY_KEYS`` and its URL's) refuse a stored
    manifest: True only when a key is configured and the manifest's signature does not check under it (it is
    parsed only then).

    Raises:
        TrustConfigError: a configured key cannot be read.
        ValueError: a key is configured and ``manifest`` is not JSON, or is over the manifest cap or the JSON depth
            bound (``InputLimitError``).
    """
    from precompile.artifact import trust

    policy = trust.policy(cache)
    return policy.required and not policy.check(loads_json(manifest, MAX_MANIFEST_BYTES, "manifest")).ok
