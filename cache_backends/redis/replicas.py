"""Blobs read from a Redis Cluster's replicas, so that a storm on one model does not pull all its bytes from one node.

Each blob's head and chunks share one hash tag, so one slot, so one master: without replicas, every worker loading a
model reads each of its blobs from the same node.  Blobs are content-addressed and immutable, and every read is
verified against its digest, so any copy that hashes right is the blob: a cluster cache (``cluster=1``, unless
``replica_reads=0``) reads blob heads and chunks through a second cluster client whose read commands go to a random
node of the slot, its master or one of its replicas (redis-py's ``LoadBalancingStrategy.RANDOM``, over ``READONLY``
connections).  What that pass does not return verified, the masters are asked for, as without replicas:

- a replica lags (a blob written a moment ago is not there yet): the master has it, so a replica's miss is never a
  cache miss;
- a replica's copy is damaged: the master's copy is read; only the master's verdict drops a blob or counts an error;
- the replicas fail (a node down, ``LOADING``, ``MASTERDOWN``, an ACL without ``READONLY``): logged at debug level,
  and the replica pass is skipped for ``down_s`` seconds (the replicas' own breaker), the masters serve meanwhile.

Refs, leases, counters, TTL refreshes and every write go to the masters.  Counted: ``replica_hits`` (blobs the
replica pass returned) and ``replica_fallbacks`` (blobs it did not, read from the masters).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from cache_backends.redis.health import Breaker, server_key
from precompile.errors import CacheError

log = logging.getLogger("precompile.cache")


class ReplicasMixin:
    """The replica pass of :meth:`~cache_backends.redis.blobs.BlobsMixin.get_blobs`, for a
    :class:`~cache_backends.redis.cache.RedisCache` (which provides ``url``, ``down_s``, ``_talk``, ``_read_blobs``,
    ``_count`` and ``_warn_once``)."""

    url: str
    down_s: float

    def _init_replicas(self, factory: Callable[[], Any] | None) -> None:
        """``factory`` opens the replica client (on first use: a cache that never reads a blob never opens it), or
        None when blobs are read from the masters only."""
        self._replica_factory = factory
        self._replica_client: Any = None
        self._replica_lock = threading.Lock()
        self._replica_breaker = Breaker.for_server(server_key(self.url) + "#replicas")

    @property
    def replica_reads(self) -> bool:
        """True when blob reads go to replicas first (``replica_reads``, on by default for a cluster)."""
        return self._replica_factory is not None

    def _replicas(self) -> Any:
        """The replica client, opened on first use.  Call inside ``_talk(replica=True)``."""
        with self._replica_lock:
            if self._replica_client is None:
                self._replica_client = self._replica_factory()  # type: ignore[misc]
            return self._replica_client

    def _read_from_replicas(self, unique: list[str], bound: dict[str, int]) -> dict[str, bytes]:
        """``{digest: verified bytes}`` for the blobs of ``unique`` that the replica client reads whole (from a random
        node of each slot); the others are left to the masters.  Drops nothing, counts no error, never raises."""
        if self._replica_breaker.open_for() > 0:
            return {}
        try:
            with self._talk("opening the replica client", replica=True):
                client = self._replicas()
            read = self._read_blobs(client, unique, bound, replica=True)  # type: ignore[attr-defined]
        except CacheError as err:
            log.debug("replica read of %d blob(s) from %s failed (%s); reading from the masters", len(unique),
                      self.url, err)
            self._count(replica_fallbacks=len(unique))  # type: ignore[attr-defined]
            return {}
        self._count(bytes_read=read.nread, replica_hits=len(read.found),  # type: ignore[attr-defined]
                    replica_fallbacks=len(unique) - len(read.found))
        return read.found

    def _replica_failed(self, what: str, err: BaseException) -> None:
        """The replica client failed: skip the replica pass for ``down_s`` seconds (the masters serve), logged once
        as a warning (an ACL without READONLY, say, would otherwise be silent), then at debug level."""
        self._replica_breaker.trip(self.down_s, f"{type(err).__name__}: {err}")
        message = (f"reading blobs from the replicas of Redis cluster {self.url} failed while {what} "
                   f"({type(err).__name__}: {err}); reading from the masters for {self.down_s:g} s")
        self._warn_once("replicas", message)  # type: ignore[attr-defined]

    def _close_replicas(self) -> None:
        """Close the replica client's connections, if it was opened.  Never raises."""
        client, self._replica_client = self._replica_client, None
        if client is not None:
            try:
                client.close()
            except Exception as err:  # noqa: BLE001 - closing never fails anything
                log.debug("closing the replica client of %s: %s", self.url, err)
