"""Redis cache URLs: precompile's query options and the redis-py clients they open (the URL shown is redacted by
:mod:`cache_backends.redaction`).

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
from urllib.parse import parse_qsl, urlencode, urlsplit

import redis
import redis.exceptions as rex

from cache_backends.options import (
    AGE_S,
    MAX_CHUNK,
    TIMEOUT_S,
    WAIT_S,
    parse_bool,
    parse_int_range,
    parse_level,
    parse_nodes,
    parse_positive_seconds,
    parse_prefix,
    parse_seconds,
    parse_size,
)
from cache_backends.redis.health import DEFAULT_DOWN_S, server_key
from cache_backends.redaction import misread_password, redact_url, redacting
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

#: Our URL options (removed before the URL goes to redis-py) and their parsers; each number is finite and bounded
#: (:mod:`cache_backends.options`).
URL_OPTIONS: dict[str, Callable[[str, str], object]] = {
    "prefix": parse_prefix,
    "ttl": functools.partial(parse_positive_seconds, most=AGE_S),
    "chunk_size": functools.partial(parse_size, most=MAX_CHUNK),
    "read_only": parse_bool,
    "cluster": parse_bool,
    "lease_ttl": functools.partial(parse_positive_seconds, most=WAIT_S),
    "wait": functools.partial(parse_seconds, most=WAIT_S),
    "timeout": functools.partial(parse_positive_seconds, most=TIMEOUT_S),
    "down_s": functools.partial(parse_seconds, most=WAIT_S),
    "level": parse_level,
    "counters": parse_bool,
    "replica_reads": parse_bool,
    "retry_s": functools.partial(parse_seconds, most=TIMEOUT_S),
    "nodes": parse_nodes,
    "spread": parse_bool,
}
#: redis-py's own numeric URL options, checked here the same way and passed on as given (a socket timeout of
#: 1e306 overflowed a timeval in redis-py).
REDIS_PY_NUMBERS: dict[str, Callable[[str, str], object]] = {
    "socket_timeout": functools.partial(parse_positive_seconds, most=TIMEOUT_S),
    "socket_connect_timeout": functools.partial(parse_positive_seconds, most=TIMEOUT_S),
    "health_check_interval": functools.partial(parse_int_range, lowest=0, most=int(WAIT_S)),
    "db": functools.partial(parse_int_range, lowest=0, most=(1 << 31) - 1),
    "max_connections": functools.partial(parse_int_range, lowest=1, most=1 << 20),
    "socket_read_size": functools.partial(parse_int_range, lowest=1, most=MAX_CHUNK),
    "protocol": functools.partial(parse_int_range, lowest=2, most=3),
}

#: URL option -> keyword argument of ``RedisCache.__init__``.
_KWARGS = {"prefix": "prefix", "ttl": "ttl_s", "chunk_size": "chunk_bytes", "read_only": "read_only",
           "level": "level", "lease_ttl": "lease_ttl_s", "wait": "wait_s", "down_s": "down_s",
           "counters": "counters", "retry_s": "retry_s", "spread": "spread"}

#: Nodes of each Redis Cluster this process has seen (``host:port`` of the URL -> every node's ``(host, port)``),
#: tried after the URL's own node when a cluster client is opened: a cache opened after the URL's node died (a
#: master killed, its replica promoted) still finds the cluster.
_KNOWN_NODES: dict[str, list[tuple[str, int]]] = {}
_KNOWN_LOCK = threading.Lock()


def open_client(url: str) -> tuple[Any, str, dict[str, Any]]:
    """Parse a Redis cache URL and make its redis-py client.

    Nothing is sent to the server (except by a cluster client, which asks a node for the slot map).

    Returns:
        ``(client, the URL redacted (:func:`~cache_backends.redaction.redact_url`), {RedisCache keyword:
        value})`` for the options the URL gives; for a cluster, ``replica_reads`` (on unless ``replica_reads=0``):
        the client's connections then send ``READONLY`` as they open, so that the cache may send a blob read to
        any node of its slot (:mod:`cache_backends.redis.replicas`).  ``retry_s`` is always given.

    Every message of an error raised here has the URL's secrets removed
    (:func:`~cache_backends.redaction.redacting`).

    Raises:
        CacheURLError: the URL does not parse, an ``@`` follows its host (a password's ``/?#@`` not
            percent-encoded: :func:`~cache_backends.redaction.misread_password`), the scheme is not a Redis one, an
            option is unknown, repeated, malformed or out of its range, ``cluster=1`` is combined with ``unix://``
            or a database other than 0, ``replica_reads=1`` is given without ``cluster=1``, or an ``ssl_*`` option
            without ``rediss://``.
        CacheUnavailableError: none of a cluster's known nodes can be reached, or every master timed out (each
            node is waited for at most one timeout: :mod:`cache_backends.redis.opening`), or an open of the same
            cluster timed out less than ``down_s`` seconds ago.
    """
    with redacting(url):  # a message echoing a raw option value, or redis-py's, loses the URL's secrets
        return _open_client(url)


def _open_client(url: str) -> tuple[Any, str, dict[str, Any]]:
    try:
        parts = urlsplit(url.strip())
    except ValueError as err:  # "Invalid IPv6 URL"
        raise CacheURLError(f"malformed cache URL {redact_url(url)!r}: {err}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("redis", "rediss", "unix"):
        raise CacheURLError(f"RedisCache opens redis://, rediss:// and unix:// URLs, got {redact_url(url)!r}")
    if misread_password(url):
        raise CacheURLError(f"cache URL {redact_url(url)!r} has an '@' after its host: a password holding '/', '?', "
                            "'#' or '@' must be percent-encoded (%2F, %3F, %23, %40), e.g. with "
                            "urllib.parse.quote(password, safe='')")
    if scheme != "unix" and not parts.hostname:
        raise CacheURLError(f"Redis URL {redact_url(url)!r} names no host; e.g. 'redis://cache.internal:6379/0'")
    if scheme == "unix" and not parts.path:
        raise CacheURLError(f"unix URL {redact_url(url)!r} names no socket path; e.g. "
                            "'unix:///run/redis/redis.sock?db=0'")
    try:
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as err:
        raise CacheURLError(f"malformed query in cache URL {redact_url(url)!r}: {err}") from err
    ours: dict[str, object] = {}
    passthrough: list[tuple[str, str]] = []
    for name, raw in query:
        if name in URL_OPTIONS:
            if name in ours:
                raise CacheURLError(f"option {name!r} given twice in cache URL {redact_url(url)!r}")
            ours[name] = URL_OPTIONS[name](name, raw)
        elif name in redis_url_options() or name.startswith("ssl_") or name == "client_name":
            if name.startswith("ssl_") and scheme != "rediss":  # redis-py hands them to a plain connection: TypeError
                raise CacheURLError(f"option {name!r} of cache URL {redact_url(url)!r} configures TLS, which needs a "
                                    "rediss:// URL; use rediss:// (or drop the ssl_* options)")
            if name in REDIS_PY_NUMBERS:
                REDIS_PY_NUMBERS[name](name, raw)
            passthrough.append((name, raw))
        else:
            raise CacheURLError(f"unknown option {name!r} in cache URL {redact_url(url)!r}; precompile's: "
                                f"{', '.join(URL_OPTIONS)}; redis-py's: {', '.join(sorted(redis_url_options()))}"
                                ", ssl_*")
    timeout = float(ours.pop("timeout", DEFAULT_TIMEOUT_S))  # type: ignore[arg-type]
    redis_url = f"{scheme}://{parts.netloc}{parts.path}" + (f"?{urlencode(passthrough)}" if passthrough else "")
    kwargs: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": min(timeout, 2.0)}
    cluster = bool(ours.pop("cluster", False))
    replica_reads = ours.pop("replica_reads", None)
    if replica_reads and not cluster:
        raise CacheURLError(f"replica_reads=1 needs a Redis Cluster (cluster=1), got {redact_url(url)!r}")
    seeds = ours.pop("nodes", ())
    if seeds and not cluster:
        raise CacheURLError(f"nodes= (more nodes to start from) needs a Redis Cluster (cluster=1), got "
                            f"{redact_url(url)!r}")
    ours.setdefault("retry_s", DEFAULT_CLUSTER_RETRY_S if cluster else 0.0)
    try:
        from redis.backoff import ExponentialBackoff
        from redis.retry import Retry

        if cluster:  # _cluster_client sets its own retries (see there)
            if scheme == "unix":
                raise CacheURLError(f"cluster=1 needs a redis:// or rediss:// URL, got {redact_url(url)!r}")
            if parts.path.strip("/") not in ("", "0"):
                raise CacheURLError(f"a Redis Cluster has only database 0, got {redact_url(url)!r}")
            ours["replica_reads"] = replica_reads is not False
            breaker = open_breaker(server_key(redact_url(url)), seeds)
            if breaker.open_for() > 0:
                raise CacheUnavailableError(f"Redis cluster at {redact_url(url)} cannot be reached ({breaker.reason}); "
                                            f"not trying again for {breaker.open_for():.1f} s more")
            guard = OpenGuard()
            try:
                client = _cluster_client(redis_url, kwargs, replicas=bool(ours["replica_reads"]), seeds=seeds,
                                         guard=guard)
            except DOWN_ERRORS as err:
                if not guard.timed_out:
                    raise
                # a slow failure: the opens after this one fail at once for down_s
                down_s = float(ours.get("down_s", DEFAULT_DOWN_S))  # type: ignore[arg-type]
                why = f"{len(guard.timed_out)} of its nodes timed out ({timeout:g} s each) while it was opened"
                breaker.trip(down_s, why)
                raise CacheUnavailableError(f"Redis cluster at {redact_url(url)} cannot be reached: {why}; not trying "
                                            f"again for {down_s:g} s") from err
        else:
            # one quick retry for a reset connection (a server restarted, an idle connection closed); never for a
            # timeout: a stalled server must cost one timeout, not two (redis-py retries timeouts by default)
            retry = Retry(ExponentialBackoff(cap=0.2, base=0.02), 1, supported_errors=(rex.ConnectionError,))
            client = redis.Redis.from_url(redis_url, retry=retry, **kwargs)
    except (CacheURLError, CacheUnavailableError):
        raise
    except (ValueError, TypeError) as err:
        raise CacheURLError(f"invalid Redis URL {redact_url(url)!r}: {err}") from err
    except DOWN_ERRORS as err:  # the cluster client contacts a node at construction
        raise CacheUnavailableError(f"Redis cluster at {redact_url(url)} cannot be reached: {err}") from err
    return client, redact_url(url), {_KWARGS.get(k, k): v for k, v in ours.items()}


def _cluster_client(redis_url: str, kwargs: dict[str, Any], *, replicas: bool, seeds: tuple[tuple[str, int], ...],
                    guard: OpenGuard) -> Any:
    """A ``RedisCluster`` for ``redis_url``, routing every command to the master of its key's slot; with
    ``replicas``, its connections send ``READONLY`` as they open, so that a read sent to a replica
    (``target_nodes``) is served there.  The slot map is
    asked of the URL's node or any of ``seeds`` (the URL's ``nodes=``), whichever answers; when none can be
    reached (a master killed, its replica promoted), the other nodes of that cluster this process has seen are
    tried.  Each node is waited for at most one timeout in all (``guard``, :class:`OpenGuard`: a node that timed
    out is not asked again while the client is built).

    Raises:
        redis.exceptions.RedisClusterException, ConnectionError...: no node answers.
        redis.exceptions.TimeoutError: every master timed out (:meth:`OpenGuard.check`).
    """
    from redis.backoff import NoBackoff
    from redis.cluster import ClusterNode
    from redis.retry import Retry

    RedisCluster = _spread_cluster_class(readonly=replicas)
    parts = urlsplit(redis_url)
    where = f"{parts.hostname}:{parts.port or 6379}"
    extra: dict[str, Any] = {}
    # While it is built the client may retry: its COMMAND goes to a random node (see _spread_cluster_class), and one
    # that is down (a master killed, not yet failed over) must not fail the open, so another is asked.  Once built,
    # none: redis-py retries every ERRORS_ALLOW_RETRY (timeouts too, whatever supported_errors says) and reloads
    # the slot map between tries, so one stalled node cost several timeouts a call; failovers are ridden out by
    # redis_failover.retrying instead, with backoff and a deadline.
    # A node that times out is not asked again while the client is built, so those retries cost a stalled node
    # one timeout in all (cache_backends/redis/opening.py).
    extra["retry"] = Retry(NoBackoff(), 10)
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
def _spread_cluster_class(readonly: bool = False) -> type:
    """redis-py's ``RedisCluster`` with its start-up ``COMMAND`` sent to a random node instead of its default node;
    with ``readonly``, every connection it opens sends ``READONLY`` first (see :func:`_cluster_client`).

    Every cluster client asks ``COMMAND`` once as it is built (redis-py's ``CommandsParser``, to learn where each
    command's keys are): about 90 KB of reply, sent by redis-py's default node, the first master of the slot map,
    the same node for every worker.  A storm of N workers then pulls 90 KB x N (twice that when each worker had a
    second client for its replica reads) from that one node, the busiest by far when artifacts are small
    (docs/fleet.md).  ``COMMAND`` reads nothing stored, so any node answers it the same; a random one of all the
    nodes, replicas too, spreads the load (redis-py sends a ``RANDOM`` command to a random master: that would leave
    the masters ~90 KB a worker busier than their replicas).  Subclassing for a class attribute is redis-py's own
    pattern (``COMMAND_FLAGS`` is read per instance, ``self.__class__.COMMAND_FLAGS.copy()``).

    ``READONLY`` lets a replica serve reads of its slots to this connection and changes nothing on a master (writes
    included), so one client's connections serve the replica pass and everything else.  redis-py sends it itself
    only when its own load balancing routes reads to replicas, which would also send refs and lease reads there
    (a lagging replica would make a stored ref look missing).  A server that refuses it (an ACL without
    ``READONLY``) leaves the connection as it was, and the client's ``readonly_refused`` says why: the cache then
    reads from the masters only.
    """
    from redis.cluster import RedisCluster
    from redis.exceptions import ResponseError
    from redis.utils import str_if_bytes

    class SpreadRedisCluster(RedisCluster):
        COMMAND_FLAGS = {**RedisCluster.COMMAND_FLAGS, "COMMAND": RedisCluster.RANDOM}
        readonly_refused = ""

        def get_random_primary_or_all_nodes(self, command_name: Any) -> Any:
            # a RANDOM command goes to a random master; COMMAND to any node, replicas too
            if str(command_name).upper() == "COMMAND":
                return self.get_random_node()
            return super().get_random_primary_or_all_nodes(command_name)

        if readonly:
            def on_connect(self, connection: Any) -> None:
                super().on_connect(connection)
                connection.send_command("READONLY")
                try:
                    reply = connection.read_response()
                except ResponseError as err:  # NOPERM: reads from the masters only
                    self.readonly_refused = str(err)[:200]
                    return
                if str_if_bytes(reply) != "OK":
                    raise rex.ConnectionError(f"READONLY answered {reply!r}")

    return SpreadRedisCluster


def redis_url_options() -> frozenset[str]:
    """Query options redis-py's ``from_url`` understands (its own table where it has one)."""
    try:
        from redis.connection import URL_QUERY_ARGUMENT_PARSERS

        return frozenset(URL_QUERY_ARGUMENT_PARSERS)
    except ImportError:  # pragma: no cover - older redis-py
        return frozenset({"db", "socket_timeout", "socket_connect_timeout", "socket_keepalive", "retry_on_timeout",
                          "max_connections", "health_check_interval", "ssl_check_hostname", "timeout", "protocol"})

