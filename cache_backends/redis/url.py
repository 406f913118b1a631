"""Redis cache URLs: precompile's query options, the redis-py clients they open, and password redaction.

``redis://[user[:password]@]host[:port][/db][?options]`` (TLS: ``rediss://``), or
``unix://[user[:password]@]/path/to/redis.sock[?db=N&options]``.  precompile's options are listed in
:data:`URL_OPTIONS` (see :class:`cache_backends.redis.cache.RedisCache`); redis-py's own (``ssl_*``,
``health_check_interval``...) pass through to its ``from_url``.
"""

from __future__ import annotations

import functools

import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import redis
import redis.exceptions as rex

from cache_backends.options import (
    parse_bool,
    parse_level,
    parse_nodes,
    parse_positive_seconds,
    parse_prefix,
    parse_seconds,
    parse_size,
)
from cache_backends.redis.health import DEFAULT_DOWN_S, server_key
from cache_backends.redis.opening import OpenGuard, open_breaker
from precompile.errors import CacheUnavailableError, CacheURLError

#: Default socket timeout, seconds: a server that does not answer within it is unavailable.
DEFAULT_TIMEOUT_S = 5.0
#: Default seconds a Redis Cluster operation keeps retrying, with backoff, through a failover (a master gone and its
#: replica not yet promoted: connections refused, CLUSTERDOWN, slots not covered); 0 for one redis-server.
DEFAULT_CLUSTER_RETRY_S = 10.0

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
    "replica_reads": parse_bool,
    "retry_s": parse_seconds,
    "nodes": parse_nodes,
}

#: URL option -> keyword argument of ``RedisCache.__init__``.
_KWARGS = {"prefix": "prefix", "ttl": "ttl_s", "chunk_size": "chunk_bytes", "read_only": "read_only",
           "level": "level", "lease_ttl": "lease_ttl_s", "wait": "wait_s", "down_s": "down_s",
           "counters": "counters", "retry_s": "retry_s"}

#: Nodes of each Redis Cluster this process has seen (``host:port`` of the URL -> every node's ``(host, port)``),
#: tried after the URL's own node when a cluster client is opened: a cache opened after the URL's node died (a
#: master killed, its replica promoted) still finds the cluster.
_KNOWN_NODES: dict[str, list[tuple[str, int]]] = {}
_KNOWN_LOCK = threading.Lock()


def open_client(url: str) -> tuple[Any, str, dict[str, Any]]:
    """Parse a Redis cache URL and make its redis-py client.

    Nothing is sent to the server (except by a cluster client, which asks a node for the slot map).

    Returns:
        ``(client, url without the password, {RedisCache keyword: value})`` for the options the URL gives; for a
        cluster with ``replica_reads`` (on unless ``replica_reads=0``), ``replica_client``: a function that opens a
        second cluster client whose reads go to a random node of the slot, its master or one of its replicas
        (READONLY connections; see :mod:`cache_backends.redis.replicas`).  ``retry_s`` is always given.

    Raises:
        CacheURLError: the scheme is not a Redis one, an option is unknown, repeated or malformed, or
            ``cluster=1`` is combined with ``unix://`` or a database other than 0, or ``replica_reads=1`` is
            given without ``cluster=1``.
        CacheUnavailableError: none of a cluster's known nodes can be reached, or every master timed out (each
            node is waited for at most one timeout: :mod:`cache_backends.redis.opening`), or an open of the same
            cluster timed out less than ``down_s`` seconds ago.
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
    replica_reads = ours.pop("replica_reads", None)
    if replica_reads and not cluster:
        raise CacheURLError(f"replica_reads=1 needs a Redis Cluster (cluster=1), got {redact(url)!r}")
    seeds = ours.pop("nodes", ())
    if seeds and not cluster:
        raise CacheURLError(f"nodes= (more nodes to start from) needs a Redis Cluster (cluster=1), got {redact(url)!r}")
    ours.setdefault("retry_s", DEFAULT_CLUSTER_RETRY_S if cluster else 0.0)
    try:
        from redis.backoff import ExponentialBackoff
        from redis.retry import Retry

        if cluster:  # _cluster_client sets its own retries (see there)
            if scheme == "unix":
                raise CacheURLError(f"cluster=1 needs a redis:// or rediss:// URL, got {redact(url)!r}")
            if parts.path.strip("/") not in ("", "0"):
                raise CacheURLError(f"a Redis Cluster has only database 0, got {redact(url)!r}")
            breaker = open_breaker(server_key(redact(url)), seeds)
            if breaker.open_for() > 0:
                raise CacheUnavailableError(f"Redis cluster at {redact(url)} cannot be reached ({breaker.reason}); "
                                            f"not trying again for {breaker.open_for():.1f} s more")
            guard = OpenGuard()
            try:
                client = _cluster_client(redis_url, kwargs, seeds=seeds, guard=guard)
            except DOWN_ERRORS as err:
                if not guard.timed_out:
                    raise
                # a slow failure: the opens after this one fail at once for down_s
                down_s = float(ours.get("down_s", DEFAULT_DOWN_S))  # type: ignore[arg-type]
                why = f"{len(guard.timed_out)} of its nodes timed out ({timeout:g} s each) while it was opened"
                breaker.trip(down_s, why)
                raise CacheUnavailableError(f"Redis cluster at {redact(url)} cannot be reached: {why}; not trying "
                                            f"again for {down_s:g} s") from err
            if replica_reads is not False:
                ours["replica_client"] = lambda: _cluster_client(redis_url, kwargs, replicas=True, seeds=seeds)
        else:
            # one quick retry for a reset connection (a server restarted, an idle connection closed); never for a
            # timeout: a stalled server must cost one timeout, not two (redis-py retries timeouts by default)
            retry = Retry(ExponentialBackoff(cap=0.2, base=0.02), 1, supported_errors=(rex.ConnectionError,))
            client = redis.Redis.from_url(redis_url, retry=retry, **kwargs)
    except (CacheURLError, CacheUnavailableError):
        raise
    except (ValueError, TypeError) as err:
        raise CacheURLError(f"invalid Redis URL {redact(url)!r}: {err}") from err
    except DOWN_ERRORS as err:  # the cluster client contacts a node at construction
        raise CacheUnavailableError(f"Redis cluster at {redact(url)} cannot be reached: {err}") from err
    return client, redact(url), {_KWARGS.get(k, k): v for k, v in ours.items()}


def _cluster_client(redis_url: str, kwargs: dict[str, Any], replicas: bool = False,
                    seeds: tuple[tuple[str, int], ...] = (), guard: OpenGuard | None = None) -> Any:
    """A ``RedisCluster`` for ``redis_url``; with ``replicas``, reads (GET, GETRANGE...) go to a random node of the
    key's slot, its master or a replica, over READONLY connections, and writes to its master.  The slot map is
    asked of the URL's node or any of ``seeds`` (the URL's ``nodes=``), whichever answers; when none can be
    reached (a master killed, its replica promoted), the other nodes of that cluster this process has seen are
    tried.  Each node is waited for at most one timeout in all (``guard``, :class:`OpenGuard`: a node that timed
    out is not asked again while the client is built).

    Raises:
        redis.exceptions.RedisClusterException, ConnectionError...: no node answers.
        redis.exceptions.TimeoutError: every master timed out (:meth:`OpenGuard.check`).
    """
    from redis.backoff import NoBackoff
    from redis.cluster import ClusterNode, LoadBalancingStrategy
    from redis.retry import Retry

    RedisCluster = _spread_cluster_class()
    parts = urlsplit(redis_url)
    where = f"{parts.hostname}:{parts.port or 6379}"
    extra: dict[str, Any] = {"load_balancing_strategy": LoadBalancingStrategy.RANDOM} if replicas else {}
    # While it is built the client may retry: its COMMAND goes to a random node (see _spread_cluster_class), and one
    # that is down (a master killed, not yet failed over) must not fail the open, so another is asked.  Once built,
    # none: redis-py retries every ERRORS_ALLOW_RETRY (timeouts too, whatever supported_errors says) and reloads
    # the slot map between tries, so one stalled node cost several timeouts a call; failovers are ridden out by
    # redis_failover.retrying instead, with backoff and a deadline.
    # A node that times out is not asked again while the client is built, so those retries cost a stalled node
    # one timeout in all (cache_backends/redis/opening.py).
    extra["retry"] = Retry(NoBackoff(), 10)
    guard = guard or OpenGuard()
    extra["connection_pool_class"] = guard.pool_class
    if seeds:
        extra["startup_nodes"] = [ClusterNode(h, p) for h, p in seeds]
    try:
        client = RedisCluster.from_url(redis_url, **extra, **kwargs)
    except DOWN_ERRORS:
        with _KNOWN_LOCK:
            known = [ClusterNode(h, p) for h, p in _KNOWN_NODES.get(where, []) if f"{h}:{p}" != where]
        if not known:
            raise
        client = RedisCluster.from_url(redis_url, **{**extra, "startup_nodes": known}, **kwargs)
    guard.check(client)
    client.set_retry(Retry(NoBackoff(), 0))
    nodes = [(n.host, int(n.port)) for n in client.get_nodes()]
    with _KNOWN_LOCK:
        _KNOWN_NODES[where] = nodes[:64]
    return client


@functools.cache
def _spread_cluster_class() -> type:
    """redis-py's ``RedisCluster`` with its start-up ``COMMAND`` sent to a random node instead of its default node.

    Every cluster client asks ``COMMAND`` once as it is built (redis-py's ``CommandsParser``, to learn where each
    command's keys are): about 90 KB of reply, sent by redis-py's default node, the first master of the slot map,
    the same node for every worker.  A storm of N workers (two clients each with replica reads) then pulls 180 KB x
    N from that one node, the busiest by far when artifacts are small (docs/fleet.md).  ``COMMAND`` reads nothing
    stored, so any node answers it the same; a random one spreads the load.  Subclassing for a class attribute is
    redis-py's own pattern (``COMMAND_FLAGS`` is read per instance, ``self.__class__.COMMAND_FLAGS.copy()``).
    """
    from redis.cluster import RedisCluster

    class SpreadRedisCluster(RedisCluster):
        COMMAND_FLAGS = {**RedisCluster.COMMAND_FLAGS, "COMMAND": RedisCluster.RANDOM}

    return SpreadRedisCluster


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
