"""The fleet-wide counters of a Redis cache: a hash (``P:counters``) updated with HINCRBY.

Increments are queued and sent in batches by one background thread per server and hash
(:class:`cache_backends.redis.health.CounterSink`), so counting never waits on the network; counts a cache may
not write (read-only without ``counters=1``, or denied) stay in the process and are shown by ``counters()``.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

import redis.exceptions as rex

from cache_backends.base import add_counts, ordered_counters
from precompile.errors import CacheError

log = logging.getLogger("precompile.cache")


class CountersMixin:
    """``incr``, ``flush`` and ``counters`` of a :class:`~cache_backends.redis.cache.RedisCache` (which provides
    ``client``, ``url``, ``write_counters``, ``_counters_key``, ``_sink``, ``_pending``, ``_lock``, ``_talk`` and
    ``_turn_read_only``)."""

    client: Any
    url: str
    write_counters: bool
    _counters_key: str
    _sink: Any
    _pending: Counter[str]
    _lock: threading.Lock

    def _count(self, **counts: int) -> None:
        if any(counts.values()):
            self.incr(**counts)

    def incr(self, **counts: int) -> None:
        """Add to the fleet-wide counters (HINCRBY on ``P:counters``).  Never raises and never waits on the
        network: the counts are queued for this server's sender thread (:class:`~cache_backends.redis.health.
        CounterSink`), which sends them in batches.  Counts that may not be written (read-only without
        ``counters=1``, or denied) stay in this process and are shown by :meth:`counters`."""
        new: Counter[str] = Counter()
        add_counts(new, counts)
        if not new:
            return
        if self.write_counters:
            self._sink.add(new)
        else:
            with self._lock:
                self._pending.update(new)

    def _send_counts(self, counts: dict[str, int]) -> None:
        """Send one batch of increments in one pipeline (the sink's sender).

        Raises:
            CacheError: not sent (down, stalled, denied: then counting stops for this cache, with one warning).
        """
        try:
            with self._talk("updating counters"):
                pipe = self.client.pipeline(transaction=False)
                for name, value in counts.items():
                    pipe.hincrby(self._counters_key, name, value)
                pipe.execute()
        except CacheError as err:
            if isinstance(err.__cause__, rex.NoPermissionError):
                self.write_counters = False
                self._sink.enabled = False
                self._turn_read_only(str(err.__cause__))
            raise

    def flush(self) -> bool:
        """Send queued counter increments now; True if none is left.  Never raises."""
        return self._sink.flush()

    def counters(self) -> dict[str, int]:
        """Fleet-wide counters (HGETALL), after sending this process's queued ones, plus those it could not send.
        Never raises: with the server down, only this process's are shown."""
        if self.write_counters:
            self._sink.flush()
        stored: Counter[str] = Counter()
        try:
            with self._talk("reading counters"):
                raw = self.client.hgetall(self._counters_key)
            for k, v in raw.items():
                try:
                    stored[k.decode() if isinstance(k, bytes) else str(k)] += int(v)
                except ValueError:
                    continue
        except CacheError as err:
            log.debug("counters of %s unreadable: %s", self.url, err)
        with self._lock:
            stored.update(self._pending)
        stored.update(self._sink.pending())
        return ordered_counters(stored)
