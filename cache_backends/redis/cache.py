"""``redis://``, ``rediss://``, ``unix://``: a cache in Redis or Redis Cluster, shared by a fleet.

Key layout (``P`` is the key prefix, default ``precompile``; see DESIGN.md, "Cache layout")::

    P:blob:{<digest>}        the blob's head: b"PCB1" + kind byte + payload
                               kind "Z" / "R": the payload is the whole blob, as a zstd frame / raw bytes
                               kind "C" / "K": the payload is struct "<IQ" (chunk count, stored length in
                               bytes); the chunks hold a zstd frame / the raw bytes
    P:blob:{<digest>}:<i>    chunk i of a chunked blob (i = 0..count-1)
    P:spread:{<digest>}      a spread blob's head: b"PCB1" + "S" / "T" + struct "<IQ" (piece count, length)
    P:piece:{<tag>}<digest>:<n>:<i>   piece i of the n pieces of a spread blob, under a hash tag of its own
    P:ref:<artifact key>     the manifest digest (64 hex ASCII bytes)
    P:lease:<artifact key>   a build lease: a random token, with a PX expiry
    P:counters               hash of fleet-wide counters (HINCRBY)

Blobs are stored as zstd frames (raw where zstd saves little), whole in their head when short, else in chunks or
pieces of at most ``chunk_size`` bytes, so a blob may exceed Redis's 512 MiB string limit.  The chunks of a chunked
blob carry its hash tag ``{<digest>}``: in a Redis Cluster they live on one slot, so one master (and its replicas)
serves every copy a fleet reads.  The pieces of a spread blob (``spread=1``, the default on a cluster; frames over
16 KiB) carry hash tags that spread them evenly over the slots (:mod:`cache_backends.redis.spread`), so every master
serves an even share of each; their reads are pipelined per node.  A read fetches the next batch of chunks or pieces
while it decompresses and hashes the last one.  A blob is written chunks (pieces) first, head last, and the head is
what makes it exist; a ref is written by callers only after every blob it names.  Every read is verified against the digest: a head or chunk that is missing, garbled or does not hash
right is a miss, counted under ``errors``, and deleted (unless read-only) so the next writer replaces it.

A serving worker opens the cache with ``read_only=1``: it never writes (no TTL refresh, no repair, no counters
unless ``counters=1``), which also works with a Redis ACL user allowed only read commands, e.g.
``ACL SETUSER worker on >pw ~precompile:* +@read +@connection``.  A write rejected with NOPERM turns a cache
read-only the same way, with one warning.

Unreachable or stalled servers raise :class:`CacheUnavailableError` after one ``timeout`` (a reset connection
is retried once; a timeout never is), and every cache of the process on that server then fails fast for
``down_s`` seconds (a circuit breaker shared by the process: :mod:`cache_backends.redis.health`), so a worker
whose Redis is gone pays one timeout, not one per blob or per call.  Counter increments are queued and sent by a
background thread, so counting never waits on the network.

In a Redis Cluster, an operation that fails the way a failover makes it fail (a master gone, its replica not yet
promoted) is retried with backoff for up to ``retry_s`` seconds before the breaker trips
(:mod:`cache_backends.redis.failover`), and blobs are read from a random node of their slot, master or replica,
then from the master where that copy is missing or damaged (:mod:`cache_backends.redis.replicas`).

Every count and length read from Redis is bounded: a chunk count is trusted only as far as chunks exist (a
garbled head claiming four billion chunks costs one round trip, not a four-billion-entry list), a blob is read
only up to the reader's ``max_bytes`` (:mod:`cache_backends.bounded`), a frame never inflates past it, and a ref
is read with ``GETRANGE`` up to :data:`~cache_backends.bounded.MAX_REF_BYTES`.

The URL and its options are parsed in :mod:`cache_backends.redis.url`, the stored head and chunk format in
:mod:`cache_backends.redis.codec`, where spread pieces go in :mod:`cache_backends.redis.spread`; blobs are read in
:mod:`cache_backends.redis.blobs` and written in :mod:`cache_backends.redis.writes`, counters in
:mod:`cache_backends.redis.counters`, build leases in :mod:`cache_backends.redis.leases`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis.exceptions as rex

from cache_backends.base import HEX64, MISS, Cache, _Miss, check_name
from cache_backends.bounded import MAX_REF_BYTES
from cache_backends.redis.blobs import WRONG_TYPE, BlobsMixin, execute
from cache_backends.redis.codec import ChunkedHead
from cache_backends.redis.counters import CountersMixin
from cache_backends.redis.failover import FailoverPending, current_deadline, is_failover, retrying
from cache_backends.redis.health import DEFAULT_DOWN_S, Breaker, CounterSink, server_key
from cache_backends.redis.leases import ACQUIRE_LUA, RELEASE_LUA, RENEW_LUA, LeasesMixin
from cache_backends.redis.replicas import ReplicasMixin
from cache_backends.redis.spread import piece_tag
from cache_backends.redis.upkeep import UpkeepMixin
from cache_backends.redis.url import DOWN_ERRORS as _DOWN_ERRORS
from cache_backends.redis.url import open_client
from cache_backends.redis.writes import WritesMixin
from precompile.errors import CacheError, CacheReadOnlyError, CacheUnavailableError

__all__ = ["RedisCache"]

log = logging.getLogger("precompile.cache")

#: Default largest chunk of a stored blob, bytes (compressed).  Redis strings may hold 512 MiB; small chunks keep
#: one reply from blocking a server and let a pipelined read stream.
DEFAULT_CHUNK_BYTES = 4 << 20
#: Default seconds a build lease lives unless renewed (renewed every third of it while the build runs).
DEFAULT_LEASE_TTL_S = 30.0


class RedisCache(ReplicasMixin, BlobsMixin, WritesMixin, CountersMixin, LeasesMixin, UpkeepMixin, Cache):
    """Blobs, refs, leases and counters in one Redis database or Redis Cluster.

    Open it with :func:`cache_backends.open_cache` and a URL::

        redis://[user[:password]@]host[:port][/db][?options]     (TLS: rediss://, options ssl_cert_reqs=... pass
        unix://[user[:password]@]/path/to/redis.sock[?db=N&options]          through to redis-py)

    Options: ``prefix`` (key prefix, default ``precompile``), ``ttl`` (seconds; every key expires unless read,
    a hit refreshes it; default none), ``chunk_size`` (bytes, ``4MiB`` style accepted; default 4 MiB),
    ``read_only`` (1/0), ``cluster`` (1: Redis Cluster through ``redis.cluster.RedisCluster``),
    ``replica_reads`` (1/0, cluster only, default 1: blob heads and chunks are read from a random node of their
    slot, master or replica, and from the master where a replica lacks them; :mod:`cache_backends.redis.replicas`),
    ``retry_s`` (seconds an operation keeps retrying through a cluster failover, with backoff; default 10 for a
    cluster, 0 for one server; :mod:`cache_backends.redis.failover`), ``nodes`` (cluster only: more nodes to ask
    for the slot map, ``host:port`` separated by commas, so that a worker starting while the URL's node is down
    still opens the cache), ``spread`` (1/0: write blobs longer than 16 KiB as spread pieces; default 1 on a
    cluster, 0 on one server: ``spread=0`` writes the chunked layout, which precompile versions before the spread
    layout read too),
    ``lease_ttl`` (seconds a build lease lives unless renewed; default 30), ``wait`` (seconds a worker waits for
    another's build before building itself; default 600), ``timeout`` (socket timeout, seconds; default 5),
    ``down_s`` (seconds to fail fast after the server was unreachable; default 10), ``level`` (zstd level),
    ``counters`` (1/0: send counter increments; default 1, and 0 with ``read_only=1``: a read-only serving worker
    that should count its hits in the fleet's hit rate sets ``read_only=1&counters=1``, with an ACL selector that
    allows only ``HINCRBY`` on the counters key, e.g. ``(~precompile:counters +hincrby)``).
    Other query options (``ssl_ca_certs``, ``health_check_interval``...) go to redis-py's ``from_url``; ``ssl_*``
    only with ``rediss://``.  Every number is finite and bounded (:mod:`cache_backends.options`).

    Args:
        client: a ``redis.Redis`` or ``redis.cluster.RedisCluster`` (bytes replies, ``decode_responses`` off).
        url: the URL shown in logs and stats; stored redacted (:attr:`Cache.url <cache_backends.base.Cache.url>`).

    Raises:
        ValueError: a numeric option is out of range.
    """

    supports_leases = True

    def __init__(self, client: Any, *, url: str, prefix: str = "precompile", ttl_s: float | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, read_only: bool = False, level: int = 3,
                 lease_ttl_s: float = DEFAULT_LEASE_TTL_S, wait_s: float = 600.0, down_s: float = DEFAULT_DOWN_S,
                 counters: bool | None = None, retry_s: float = 0.0, replica_reads: bool = False,
                 spread: bool | None = None):
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be a positive number of bytes, got {chunk_bytes!r}")
        if ttl_s is not None and ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0 seconds or None, got {ttl_s!r}")
        self.client = client
        self.url = url
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.chunk_bytes = int(chunk_bytes)
        self.read_only = bool(read_only)
        self._configured_read_only = bool(read_only)
        self.level = int(level)
        self.lease_ttl_s = float(lease_ttl_s)
        self.wait_s = float(wait_s)
        self.down_s = float(down_s)
        self.cluster = any(c.__name__ == "RedisCluster" for c in type(client).__mro__)
        #: whether blobs longer than their head holds are written in the spread layout (else the chunked one)
        self.spread = self.cluster if spread is None else bool(spread)
        #: whether counter increments are sent (the one write a read-only cache may be allowed)
        self.write_counters = (not read_only) if counters is None else bool(counters)
        self.retry_s = float(retry_s)
        self._breaker = Breaker.for_server(server_key(url))
        self._init_replicas(replica_reads and self.cluster)
        self._pending: Counter[str] = Counter()  # counts this cache may not send (read-only, denied)
        self._sink = CounterSink.for_hash(server_key(url), self._counters_key, self._send_counts)
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._acquire = client.register_script(ACQUIRE_LUA)
        self._release = client.register_script(RELEASE_LUA)
        self._renew = client.register_script(RENEW_LUA)

    # ------------------------------------------------------------------------------------------------- URLs
    @classmethod
    def from_url(cls, url: str) -> RedisCache:
        """Open a ``redis://``, ``rediss://`` or ``unix://`` URL (see the class docstring for its options).

        Nothing is sent to the server here: an unreachable server shows on first use, as
        :class:`CacheUnavailableError`.

        Raises:
            CacheURLError: the scheme is not a Redis one, an option is unknown, repeated or malformed, or
                ``cluster=1`` is combined with ``unix://`` or a database other than 0.
        """
        client, redacted, kwargs = open_client(url)
        return cls(client, url=redacted, **kwargs)

    # ------------------------------------------------------------------------------------------------- keys
    def _head_key(self, digest: str) -> str:
        return f"{self.prefix}:blob:{{{digest}}}"

    def _chunk_key(self, digest: str, i: int) -> str:
        return f"{self.prefix}:blob:{{{digest}}}:{i}"

    def _spread_key(self, digest: str) -> str:
        return f"{self.prefix}:spread:{{{digest}}}"

    def _piece_key(self, digest: str, i: int, count: int) -> str:
        return f"{self.prefix}:piece:{{{piece_tag(digest, i, count)}}}{digest}:{count}:{i}"

    def _part_key(self, digest: str, i: int, head: ChunkedHead) -> str:
        """The key of chunk ``i`` of a chunked blob, or of piece ``i`` of a spread one (``head`` says which)."""
        return self._piece_key(digest, i, head.count) if head.spread else self._chunk_key(digest, i)

    def _ref_key(self, key: str) -> str:
        return f"{self.prefix}:ref:{key}"

    def _lease_key(self, key: str) -> str:
        return f"{self.prefix}:lease:{key}"

    @property
    def _counters_key(self) -> str:
        return f"{self.prefix}:counters"

    # --------------------------------------------------------------------------------------- error handling
    @contextmanager
    def _talk(self, what: str, write: bool = False, *, replica: bool = False,
              deadline: float | None = None) -> Iterator[None]:
        """Run Redis commands; map redis-py errors to :class:`CacheError` and trip the breaker when down.

        Inside a :func:`~cache_backends.redis.failover.retrying` call (or with an explicit ``deadline``, for a helper
        thread), an error a cluster failover causes raises ``FailoverPending`` until the deadline, so that the call
        runs again.  With ``replica`` (the replica pass of a read), errors trip the replicas' own breaker only
        and are logged at debug level: the caller reads from the masters instead."""
        if write and self.read_only:
            raise CacheReadOnlyError(self._read_only_message(what))
        breaker = self._replica_breaker if replica else self._breaker
        wait = breaker.open_for()
        if wait > 0:
            raise CacheUnavailableError(f"Redis at {self.url}{' (replicas)' if replica else ''} is unavailable "
                                        f"({breaker.reason}); not retrying for {wait:.1f} s more")
        deadline = current_deadline() if deadline is None else deadline
        try:
            try:
                yield
            except CacheError:
                raise
            except Exception as err:
                if replica:  # the caller reads from the masters instead
                    self._replica_failed(what, err)
                    raise CacheUnavailableError(f"Redis replicas of {self.url} failed while {what}: {err}") from err
                if is_failover(err) and self.retry_s > 0:
                    if deadline is None:  # not a retried call (counters, upkeep): fails, but leaves the breaker
                        raise CacheUnavailableError(f"Redis at {self.url} failed while {what}: "
                                                    f"{type(err).__name__}: {err}") from err
                    if time.monotonic() < deadline:
                        raise FailoverPending(f"{what}: {type(err).__name__}: {err}") from err
                    # the failover outlasted retry_s: down, as a lost server is, so that the calls after this one
                    # fail fast instead of each spending retry_s again
                    self._trip(f"still failing over after {self.retry_s:g} s: {type(err).__name__}: {err}")
                    raise CacheUnavailableError(f"Redis at {self.url} failed while {what}: "
                                                f"{type(err).__name__}: {err}") from err
                raise
        except CacheError:
            raise
        except rex.NoPermissionError as err:
            if write:
                self._turn_read_only(str(err))
                raise CacheReadOnlyError(self._read_only_message(what)) from err
            raise CacheUnavailableError(f"Redis at {self.url} denied {what}: {err}; give the user +@read "
                                        f"on keys {self.prefix}:*") from err
        except rex.AuthenticationError as err:
            self._trip(f"authentication failed: {err}")
            raise CacheUnavailableError(f"Redis at {self.url} rejected the credentials while {what}: {err}; check "
                                        "the user and password in the cache URL") from err
        except _DOWN_ERRORS as err:
            self._trip(f"{type(err).__name__}: {err}")
            raise CacheUnavailableError(
                f"Redis at {self.url} failed while {what}: {type(err).__name__}: {err}") from err
        except rex.RedisError as err:  # OOM, READONLY replica, busy script...: this call fails, the server is up
            raise CacheUnavailableError(f"Redis at {self.url} refused {what}: {type(err).__name__}: {err}") from err

    def _trip(self, reason: str) -> None:
        self._breaker.trip(self.down_s, reason)
        self._warn_once("down", f"Redis cache {self.url} is unavailable ({reason}); failing fast for "
                                f"{self.down_s:g} s at a time")

    def _warn_once(self, kind: str, message: str) -> None:
        first = kind not in self._warned
        self._warned.add(kind)
        log.log(logging.WARNING if first else logging.DEBUG, "%s", message)

    def _turn_read_only(self, reason: str) -> None:
        if not self.read_only:
            self.read_only = True
            self._warn_once("read-only", f"Redis cache {self.url} denies writes ({reason}); using it read-only")

    def _read_only_message(self, what: str) -> str:
        why = "it was opened with read_only=1" if self._configured_read_only else "its user may not write"
        return f"not {what}: Redis cache {self.url} is read-only ({why})"

    # ------------------------------------------------------------------------------------------------- refs
    @retrying
    def get_ref(self, key: str) -> str | _Miss:
        """The manifest digest stored under artifact key ``key``, or :data:`MISS`.  With a TTL a hit refreshes
        the ref's expiry.  A value that is not a digest, or a key of another type (a hash, a list...), is dropped,
        counted under ``errors``, and a miss; :meth:`set_ref` (one SET) replaces a key of any type.

        Raises:
            ValueError: ``key`` is not 64 lowercase hex characters.
            CacheUnavailableError: Redis cannot be reached.
        """
        rkey = self._ref_key(check_name(key, "artifact key"))
        refresh = self.ttl_s is not None and not self.read_only
        with self._talk(f"reading ref {key[:12]}"):
            pipe = self.client.pipeline(transaction=False)
            pipe.getrange(rkey, 0, MAX_REF_BYTES - 1)  # bounded: a planted 512 MiB value costs 256 bytes
            if refresh:
                pipe.pexpire(rkey, int(self.ttl_s * 1000))  # type: ignore[operator]
            raw = execute(pipe)[0]
        if raw is None or raw == b"":  # GETRANGE of a missing key is empty
            return MISS
        text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else ""  # WRONG_TYPE: a hash, a list...
        if not HEX64.match(text):
            log.warning("Redis ref %s in %s does not hold a digest%s; %s", key[:12], self.url,
                        " (it is a key of another type)" if raw is WRONG_TYPE else "",
                        "a miss, left in place (read-only cache)" if self.read_only else "dropping it")
            self._count(errors=1)
            if not self.read_only:
                try:
                    with self._talk("dropping a garbled ref", write=True):
                        self.client.delete(rkey)
                except CacheError:
                    pass
            return MISS
        return text

    @retrying
    def set_ref(self, key: str, digest: str) -> None:
        """Point ``key`` at ``digest`` (one SET, atomic; with the TTL).

        Raises:
            ValueError: ``key`` or ``digest`` is not 64 lowercase hex characters.
            CacheReadOnlyError: the cache is read-only.
            CacheUnavailableError: Redis cannot be reached.
        """
        rkey = self._ref_key(check_name(key, "artifact key"))
        check_name(digest)
        with self._talk(f"writing ref {key[:12]}", write=True):
            px = int(self.ttl_s * 1000) if self.ttl_s is not None else None
            self.client.set(rkey, digest.encode(), px=px)

    @retrying
    def delete_ref(self, key: str, digest: str | None = None) -> bool:
        """Remove ``key``; True if it existed (with ``digest``: if it named that digest; one Lua script).

        Raises:
            CacheReadOnlyError: the cache is read-only.
            CacheUnavailableError: Redis cannot be reached.
        """
        rkey = self._ref_key(check_name(key, "artifact key"))
        with self._talk(f"deleting ref {key[:12]}", write=True):
            if digest is not None:
                return bool(self._release(keys=[rkey], args=[digest]))
            return bool(self.client.delete(rkey))

    def iter_refs(self) -> Iterator[tuple[str, str]]:
        """Yield ``(key, digest)`` for every well-formed ref (SCAN on every primary of a cluster).

        Raises:
            CacheUnavailableError: Redis cannot be reached.
        """
        yield from self._list_refs()

    @retrying
    def _list_refs(self) -> list[tuple[str, str]]:
        with self._talk("listing refs"):
            keys = [k for k in self._scan_keys(f"{self.prefix}:ref:*") if HEX64.match(k.rsplit(":", 1)[-1])]
            pipe = self.client.pipeline(transaction=False)
            for k in keys:
                pipe.getrange(k, 0, MAX_REF_BYTES - 1)
            values = execute(pipe) if keys else []  # a ref of another type is skipped, as a garbled one is
        texts = [v.decode("ascii", "replace") if isinstance(v, bytes) else "" for v in values]
        return [(k.rsplit(":", 1)[-1], t) for k, t in zip(keys, texts) if HEX64.match(t)]

    def stats(self) -> dict[str, object]:
        """Counters, ``hit_rate``, ``url``, ``backend``, ``prefix``, ``ttl_s``, ``chunk_bytes``, ``read_only``,
        ``cluster``, ``replica_reads`` and ``retry_s``.  JSON-ready; never raises."""
        out = super().stats()
        out.update({"prefix": self.prefix, "ttl_s": self.ttl_s, "chunk_bytes": self.chunk_bytes,
                    "read_only": self.read_only, "cluster": self.cluster, "replica_reads": self.replica_reads,
                    "retry_s": self.retry_s})
        return out

    # ------------------------------------------------------------------------- upkeep (precompile verify, gc)
    def ping(self) -> bool:
        """True if the server answers PING now (no breaker)."""
        try:
            return bool(self.client.ping())
        except (rex.RedisError, *_DOWN_ERRORS):
            return False

    def close(self) -> None:
        """Send the queued counts (one try: at most one socket timeout, none while the breaker is open), stop the
        counter sender from using this cache (another open cache of the same server takes over; with none, later
        counts stay queued in this process, shown by :meth:`counters`), and close the connection pool (and a
        cluster client's node connections).  Never raises."""
        self._sink.flush()
        self._sink.detach(self._send_counts)
        try:
            self.client.close()
        except (rex.RedisError, *_DOWN_ERRORS):
            pass
