"""Redis cache URLs: precompile's query options, the redis-py client they open, and password redaction.

``redis://[user[:password]@]host[:port][/db][?options]`` (TLS: ``rediss://``), or
``unix://[user[:password]@]/path/to/redis.sock[?db=N&options]``.  precompile's options are listed in
:data:`URL_OPTIONS` (see :class:`cache_backends.redis_cache.RedisCache`); redis-py's own (``ssl_*``,
``health_check_interval``...) pass through to its ``from_url``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import redis
import redis.exceptions as rex

from cache_backends.options import (
    parse_bool,
    parse_level,
    parse_positive_seconds,
    parse_prefix,
    parse_seconds,
    parse_size,
)
from precompile.errors import CacheUnavailableError, CacheURLError

#: Default socket timeout, seconds: a server that does not answer within it is unavailable.
DEFAULT_TIMEOUT_S = 5.0

#: Errors that mean the server cannot be used right now (trip the breaker).
DOWN_ERRORS: tuple[type[BaseException], ...] = (rex.ConnectionError, rex.TimeoutError, rex.ClusterDownError,
                                                 rex.RedisClusterException, OSError)
if hasattr(rex, "MaxConnectionsError"):
    DOWN_ERRORS += (rex.MaxConnectionsError,)

#: Our URL options (removed before the URL goes to redis-py) and their parsers.
URL_OPTIONS: dict[str, Callable[[str, str], object]] = {
    "prefix": parse_prefix,
    "ttl": parse_positive_seconds,
    "chunk_size": parse_size,
    "read_only": parse_bool,
    "cluster": parse_bool,
    "lease_ttl": parse_positive_seconds,
    "wait": parse_seconds,
    "timeout": parse_positive_seconds,
    "down_s": parse_seconds,
    "level": parse_level,
    "counters": parse_bool,
}

#: URL option -> keyword argument of ``RedisCache.__init__``.
_KWARGS = {"prefix": "prefix", "ttl": "ttl_s", "chunk_size": "chunk_bytes", "read_only": "read_only",
           "level": "level", "lease_ttl": "lease_ttl_s", "wait": "wait_s", "down_s": "down_s",
           "counters": "counters"}


def open_client(url: str) -> tuple[Any, str, dict[str, Any]]:
    """Parse a Redis cache URL and make its redis-py client.

    Nothing is sent to the server (except by a cluster client, which asks a node for the slot map).

    Returns:
        ``(client, url without the password, {RedisCache keyword: value})`` for the options the URL gives.

    Raises:
        CacheURLError: the scheme is not a Redis one, an option is unknown, repeated or malformed, or
            ``cluster=1`` is combined with ``unix://`` or a database other than 0.
        CacheUnavailableError: a cluster's node cannot be reached.
    """
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in ("redis", "rediss", "unix"):
        raise CacheURLError(f"RedisCache opens redis://, rediss:// and unix:// URLs, got {url!r}")
    if scheme != "unix" and not parts.hostname:
        raise CacheURLError(f"Redis URL {url!r} names no host; e.g. 'redis://cache.internal:6379/0'")
    if scheme == "unix" and not parts.path:
        raise CacheURLError(f"unix URL {url!r} names no socket path; e.g. 'unix:///run/redis/redis.sock?db=0'")
    try:
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as err:
        raise CacheURLError(f"malformed query in cache URL {redact(url)!r}: {err}") from err
    ours: dict[str, object] = {}
    passthrough: list[tuple[str, str]] = []
    for name, raw in query:
        if name in URL_OPTIONS:
            if name in ours:
                raise CacheURLError(f"option {name!r} given twice in cache URL {redact(url)!r}")
            ours[name] = URL_OPTIONS[name](name, raw)
        elif name in redis_url_options() or name.startswith("ssl_") or name == "client_name":
            passthrough.append((name, raw))
        else:
            raise CacheURLError(f"unknown option {name!r} in cache URL {redact(url)!r}; precompile's: "
                                f"{', '.join(URL_OPTIONS)}; redis-py's: {', '.join(sorted(redis_url_options()))}"
                                ", ssl_*")
    timeout = float(ours.pop("timeout", DEFAULT_TIMEOUT_S))  # type: ignore[arg-type]
    redis_url = f"{scheme}://{parts.netloc}{parts.path}" + (f"?{urlencode(passthrough)}" if passthrough else "")
    kwargs: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": min(timeout, 2.0)}
    cluster = bool(ours.pop("cluster", False))
    try:
        from redis.backoff import ExponentialBackoff
        from redis.retry import Retry

        # one quick retry for a reset connection (a server restarted, an idle connection closed); never for a
        # timeout: a stalled server must cost one timeout, not two (redis-py retries timeouts by default)
        kwargs["retry"] = Retry(ExponentialBackoff(cap=0.2, base=0.02), 1, supported_errors=(rex.ConnectionError,))
        if cluster:
            if scheme == "unix":
                raise CacheURLError(f"cluster=1 needs a redis:// or rediss:// URL, got {redact(url)!r}")
            if parts.path.strip("/") not in ("", "0"):
                raise CacheURLError(f"a Redis Cluster has only database 0, got {redact(url)!r}")
            from redis.cluster import RedisCluster

            client = RedisCluster.from_url(redis_url, **kwargs)
        else:
            client = redis.Redis.from_url(redis_url, **kwargs)
    except CacheURLError:
        raise
    except (ValueError, TypeError) as err:
        raise CacheURLError(f"invalid Redis URL {redact(url)!r}: {err}") from err
    except DOWN_ERRORS as err:  # the cluster client contacts a node at construction
        raise CacheUnavailableError(f"Redis cluster at {redact(url)} cannot be reached: {err}") from err
    return client, redact(url), {_KWARGS[k]: v for k, v in ours.items()}


def redis_url_options() -> frozenset[str]:
    """Query options redis-py's ``from_url`` understands (its own table where it has one)."""
    try:
        from redis.connection import URL_QUERY_ARGUMENT_PARSERS

        return frozenset(URL_QUERY_ARGUMENT_PARSERS)
    except ImportError:  # pragma: no cover - older redis-py
        return frozenset({"db", "socket_timeout", "socket_connect_timeout", "socket_keepalive", "retry_on_timeout",
                          "max_connections", "health_check_interval", "ssl_check_hostname", "timeout", "protocol"})


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for logs, errors and ``RedisCache.url``)."""
    parts = urlsplit(url.strip())
    if parts.password is None:
        return url.strip()
    user = quote(parts.username or "", safe="")
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))
