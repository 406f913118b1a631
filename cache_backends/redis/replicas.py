"""Blobs read from a Redis Cluster's replicas, so that a storm on one model does not pull all its bytes from one node.

Each blob's head lives on one slot, so on one master: without replicas, every worker loading a model reads it from
the same node.  Blobs are content-addressed and immutable, and every read is verified against its digest, so any
copy that hashes right is the blob: a cluster cache (``cluster=1``, unless ``replica_reads=0``) first reads blob
heads and chunks from a random node of each key's slot, its master or one of its replicas, through the cache's one
cluster client (each command sent to the node picked, as redis-py's ``target_nodes`` allows; the client's
connections send ``READONLY`` as they open, which a replica needs to serve reads and a master ignores).  What that
pass does not return verified, the masters are asked for, as without replicas:

- a replica lags (a blob written a moment ago is not there yet): the master has it, so a replica's miss is never a
  cache miss;
- a replica's copy is damaged: the master's copy is read; only the master's verdict drops a blob or counts an error;
- the replicas fail (a node down, ``LOADING``, ``MASTERDOWN``, an ACL without ``READONLY``): logged at debug level,
  and the replica pass is skipped for ``down_s`` seconds (the replicas' own breaker), the masters serve meanwhile.

Refs, leases, counters, TTL refreshes and every write go to the masters (redis-py's routing by slot).  One client
serves both passes: a worker holds one connection per node it reads from and asks ``COMMAND`` once (a second cluster
client for the replicas, as before, cost every worker 3 more connections, a second ``COMMAND`` of ~90 KB and its
parse: docs/fleet.md).  Counted: ``replica_hits`` (blobs the replica pass returned) and ``replica_fallbacks``
(blobs it did not, read from the masters).
"""

from __future__ import annotations

import logging
import random
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

    def _init_replicas(self, replica_reads: bool) -> None:
        """``replica_reads``: blobs are read from a random node of their slot first (the cache's client must send
        ``READONLY`` on its connections: :func:`cache_backends.redis.url.open_client` makes such a client)."""
        self._replica_reads = bool(replica_reads)
        self._replica_breaker = Breaker.for_server(server_key(self.url) + "#replicas")

    @property
    def replica_reads(self) -> bool:
        """True when blob reads go to replicas first (``replica_reads``, on by default for a cluster)."""
        return self._replica_reads

    def _any_node(self, key: str) -> Any:
        """A random node serving ``key``'s slot, its master or a replica, from the client's slot map (None when the
        map has no entry for it: then redis-py routes the command to the master)."""
        client: Any = self.client  # type: ignore[attr-defined]
        nodes = client.nodes_manager.slots_cache.get(client.keyslot(key))
        return random.choice(nodes) if nodes else None

    def _queue_read(self, pipe: Any, key: str, end: int, replica: bool) -> None:
        """Queue ``GETRANGE key 0 end`` on ``pipe``: sent to a random node of the key's slot with ``replica``, else to
        its master."""
        node = self._any_node(key) if replica else None
        if node is None:
            pipe.getrange(key, 0, end)
        else:
            pipe.execute_command("GETRANGE", key, 0, end, target_nodes=node)

    def _read_from_replicas(self, unique: list[str], bound: dict[str, int]) -> dict[str, bytes]:
        """``{digest: verified bytes}`` for the blobs of ``unique`` that a read from a random node of each slot returns
        whole; the others are left to the masters.  Drops nothing, counts no error, never raises."""
        if self._replica_breaker.open_for() > 0:
            return {}
        refused = getattr(self.client, "readonly_refused", "")  # type: ignore[attr-defined]
        if refused:  # the user may not send READONLY: replicas would answer MOVED
            self._replica_failed("sending READONLY", PermissionError(refused))
            self._count(replica_fallbacks=len(unique))  # type: ignore[attr-defined]
            return {}
        try:
            read = self._read_blobs(unique, bound, replica=True)  # type: ignore[attr-defined]
        except CacheError as err:
            log.debug("replica read of %d blob(s) from %s failed (%s); reading from the masters", len(unique),
                      self.url, err)
            self._count(replica_fallbacks=len(unique))  # type: ignore[attr-defined]
            return {}
        self._count(bytes_read=read.nread, replica_hits=len(read.found),  # type: ignore[attr-defined]
                    replica_fallbacks=len(unique) - len(read.found))
        return read.found

    def _replica_failed(self, what: str, err: BaseException) -> None:
        """The replica pass failed: skip it for ``down_s`` seconds (the masters serve), logged once
        as a warning (an ACL without READONLY, say, would otherwise be silent), then at debug level."""
        self._replica_breaker.trip(self.down_s, f"{type(err).__name__}: {err}")
        message = (f"reading blobs from the replicas of Redis cluster {self.url} failed while {what} "
                   f"({type(err).__name__}: {err}); reading from the masters for {self.down_s:g} s")
        self._warn_once("replicas", message)  # type: ignore[attr-defined]
