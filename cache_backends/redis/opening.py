"""Opening a Redis Cluster client while nodes stall: at most one timeout per node, then give up.

redis-py's cluster client asks its start-up nodes for the slot map and one node for ``COMMAND`` as it is built,
and retries (reloading the slot map from every start-up node in turn) on a connection error or a timeout.  With
every master stalled (SIGSTOP, a partition) and replicas answering, each of those tries paid a socket timeout on a
stalled master again: 31 s at ``timeout=2`` and 86 s at the default before the worker compiled uncached.

:class:`OpenGuard` watches one open (both passes of :func:`cache_backends.redis.url._cluster_client`): its
connection pool class gives every connection a class that remembers each node that timed out while the open runs
and refuses, at once, to ask it again.  Once the client is built, :meth:`OpenGuard.check` gives up if every master
of its slot map timed out (the cache could serve nothing), and the guard stops refusing: from then on a stalled
node costs what it costs any call (one timeout, then the cache's breaker).  A failed open that saw a timeout trips
a breaker of its own (:func:`open_breaker`), so that the opens after it fail at once for ``down_s`` seconds instead
of each paying the timeouts again (``standalone_compile`` opens the cache on every call).
"""

from __future__ import annotations

from typing import Any

import redis.exceptions as rex
from redis.connection import Connection, ConnectionPool

from cache_backends.redis.health import Breaker


class OpenGuard:
    """One cluster open: the nodes that timed out while it ran, and the connection pool class that skips them."""

    def __init__(self) -> None:
        #: ``(host, port)`` of every node a connection timed out on during the open
        self.timed_out: set[tuple[str, int]] = set()
        self.opening = True
        self._classes: dict[type, type] = {}
        guard = self

        class GuardedPool(ConnectionPool):
            def __init__(self, connection_class: type = Connection, **kwargs: Any):
                super().__init__(connection_class=guard.connection_class(connection_class), **kwargs)

        #: pass as ``connection_pool_class`` to ``RedisCluster``
        self.pool_class = GuardedPool

    def connection_class(self, base: type) -> type:
        """``base`` (redis-py's ``Connection`` or ``SSLConnection``) that, while the open runs, refuses a node that
        timed out already (a ``ConnectionError`` at once) and records each node it times out on."""
        if base not in self._classes:
            guard = self

            class Guarded(base):  # type: ignore[misc, valid-type]
                def connect_check_health(self, *args: Any, **kwargs: Any) -> Any:
                    where = (str(self.host), int(self.port))
                    if guard.opening and where in guard.timed_out:
                        raise rex.ConnectionError(f"{where[0]}:{where[1]} timed out earlier in this open; not asked "
                                                  "again")
                    try:
                        return super().connect_check_health(*args, **kwargs)
                    except rex.TimeoutError:
                        guard.note(self)
                        raise

                def read_response(self, *args: Any, **kwargs: Any) -> Any:
                    try:
                        return super().read_response(*args, **kwargs)
                    except rex.TimeoutError:
                        guard.note(self)
                        raise

            self._classes[base] = Guarded
        return self._classes[base]

    def note(self, connection: Any) -> None:
        """A connection timed out: remember its node while the open runs."""
        if self.opening:
            self.timed_out.add((str(connection.host), int(connection.port)))

    def check(self, client: Any) -> None:
        """The open is done: stop refusing nodes; raise if every master of ``client``'s slot map timed out during it.

        Raises:
            redis.exceptions.TimeoutError: every master timed out while the client was built.
        """
        self.opening = False
        masters = {(str(n.host), int(n.port)) for n in client.get_primaries()}
        if masters and masters <= self.timed_out:
            client.close()
            raise rex.TimeoutError(f"every master of the cluster ({len(masters)}) timed out while it was opened")


def open_breaker(server: str, seeds: tuple[tuple[str, int], ...]) -> Breaker:
    """The breaker of opening the cluster that ``server`` (:func:`~cache_backends.redis.health.server_key`) and
    ``seeds`` (the URL's ``nodes=``) name: tripped only by an open that timed out, apart from the breaker of calls
    (a stalled call leaves opens alone: a cache opened then fails its calls fast, as before)."""
    return Breaker.for_server(f"open {server} {sorted(seeds)}")
