"""What every :class:`~cache_backends.redis.cache.RedisCache` of one process shares about one Redis server: its
circuit breaker and its unsent counter increments.

Callers open a new cache per URL (``standalone_compile(cache="redis://...")`` does, on every call), so state that
must outlive one call lives here, keyed by the server (scheme, user, host, port or socket, database):

- :class:`Breaker`: after a server was found down or stalled, every cache of the process fails fast for
  ``down_s`` seconds instead of paying its own timeout;
- :class:`CounterSink`: counter increments are queued and sent by one background thread per counters hash, in
  batches, so that counting never waits on the network: a hit served from a local tier never stalls on a stalled
  Redis.  :meth:`CounterSink.flush` sends the queue now (``counters()``, stats, process exit).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from urllib.parse import urlsplit

log = logging.getLogger("precompile.cache")

#: Default seconds every cache of the process fails fast after a server was found down or stalled (``down_s``).
DEFAULT_DOWN_S = 10.0
#: Seconds the sender thread waits between two batches (it also wakes as soon as counts arrive).
FLUSH_INTERVAL_S = 0.2
#: Seconds the exit hook waits for the last counts to be sent.
EXIT_FLUSH_S = 2.0


def server_key(url: str) -> str:
    """The server a (redacted) cache URL names, without query options: ``scheme://user@host:port/db``."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


class Breaker:
    """Fail fast for a while after a server was found unavailable.  Thread-safe enough: a race only costs one
    more attempt."""

    _all: dict[str, Breaker] = {}
    _all_lock = threading.Lock()

    def __init__(self) -> None:
        self.down_until = 0.0
        self.reason = ""

    @classmethod
    def for_server(cls, key: str) -> Breaker:
        """The breaker of server ``key`` (:func:`server_key`), shared by the process."""
        with cls._all_lock:
            return cls._all.setdefault(key, cls())

    def open_for(self) -> float:
        """Seconds the server is still considered down (0.0 when it may be tried)."""
        return max(0.0, self.down_until - time.monotonic())

    def trip(self, down_s: float, reason: str) -> None:
        """Consider the server down for ``down_s`` seconds from now."""
        if down_s > 0:
            self.down_until = time.monotonic() + down_s
            self.reason = reason


class CounterSink:
    """Counter increments for one Redis counters hash, sent in batches by a daemon thread.

    ``send(counts)`` is supplied by the cache that registered last (its connection and error handling); it raises
    :class:`~precompile.errors.CacheError` on failure, and the counts are then kept and sent with the next batch.
    """

    _all: dict[tuple[str, str], CounterSink] = {}
    _all_lock = threading.Lock()

    def __init__(self, name: str):
        self.name = name
        self.send: Callable[[dict[str, int]], None] | None = None
        self._senders: list[Callable[[dict[str, int]], None]] = []  # of the open caches, the last registered last
        self._senders_lock = threading.Lock()  # never held over the network (the _send_lock is, for a timeout)
        self.enabled = True
        self._pending: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_hash(cls, server: str, counters_key: str, send: Callable[[dict[str, int]], None]) -> CounterSink:
        """The sink of ``counters_key`` on ``server``, now sending through ``send``."""
        with cls._all_lock:
            sink = cls._all.get((server, counters_key))
            if sink is None:
                sink = cls._all[(server, counters_key)] = cls(f"{server} {counters_key}")
            with sink._senders_lock:
                sink._senders.append(send)
                sink.send = send
            return sink

    def detach(self, send: Callable[[dict[str, int]], None]) -> None:
        """A cache closed: stop sending through ``send``; the sink then sends through another open cache of the
        same server and hash, or (none left) keeps its counts queued in this process."""
        with self._senders_lock:
            self._senders = [s for s in self._senders if s != send]
            self.send = self._senders[-1] if self._senders else None

    def add(self, counts: Counter[str]) -> None:
        """Queue ``counts`` (never blocks on the network); the sender thread sends them shortly."""
        with self._lock:
            self._pending.update(counts)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="precompile-counters", daemon=True)
                self._thread.start()
        self._wake.set()

    def pending(self) -> Counter[str]:
        """Counts queued and not yet sent."""
        with self._lock:
            return Counter(self._pending)

    def flush(self) -> bool:
        """Send the queued counts now, on this thread; True if nothing is left queued.  Never raises."""
        with self._send_lock:
            with self._lock:
                batch = {k: v for k, v in self._pending.items() if v}
            if not batch:
                return True
            if not self.enabled or self.send is None:
                return False
            try:
                self.send(batch)
            except Exception as err:  # noqa: BLE001 - counting never fails anything; kept for the next batch
                log.debug("counters of %s kept in memory: %s", self.name, err)
                return False
            with self._lock:
                self._pending.subtract(batch)
                for k in [k for k, v in self._pending.items() if not v]:
                    del self._pending[k]
            return True

    def _run(self) -> None:
        while True:
            self._wake.wait(FLUSH_INTERVAL_S)
            self._wake.clear()
            self.flush()


@atexit.register
def _flush_all_at_exit() -> None:
    """Send what is queued before the process exits, waiting at most :data:`EXIT_FLUSH_S` in all."""
    with CounterSink._all_lock:
        sinks = list(CounterSink._all.values())
    if not any(s.pending() for s in sinks):
        return
    done = threading.Event()

    def run() -> None:
        for s in sinks:
            s.flush()
        done.set()

    try:
        threading.Thread(target=run, name="precompile-counters-exit", daemon=True).start()
    except RuntimeError:  # no new thread at interpreter shutdown (some Python versions): at most one timeout here
        run()
    done.wait(EXIT_FLUSH_S)
