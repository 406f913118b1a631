"""One compile per key across a fleet: ``get_or_build`` with a build lease in the cache (DESIGN.md, "Builds").

A worker that misses takes the key's lease (Redis ``SET NX PX`` with a random token), builds, stores the
artifact (every blob, then the ref), and gives the lease back by compare-and-delete.  While it builds, a thread
renews the lease every third of its TTL.  Other workers that miss find the lease taken and poll for the ref,
with a deadline.  A builder that dies (``kill -9``, OOM, a lost node) stops renewing; its lease expires and the
first waiter to see that takes the lease over and builds.  Nobody waits past the deadline: then it builds
itself.  A cache without leases (a local directory), a read-only cache with no lease held, or a cache that
fails, means a plain local build.  The lease only saves work: correctness never depends on it, since an
artifact is content-addressed and written ref-last, so two builds of one key store the same thing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from cache_backends.base import Cache
from precompile.errors import CacheError, CacheReadOnlyError

log = logging.getLogger("precompile")

T = TypeVar("T")

#: First and largest pause between two looks at the ref while waiting for another worker's build, seconds.
POLL_FIRST_S = 0.05
POLL_MAX_S = 0.5


class _Renewer:
    """Renews a lease every ``ttl_s / 3`` seconds in a daemon thread until stopped; logs once if it is lost."""

    def __init__(self, cache: Cache, key: str, token: str, ttl_s: float):
        self.cache, self.key, self.token, self.ttl_s = cache, key, token, ttl_s
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{key[:8]}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                held = self.cache.renew_lease(self.key, self.token, self.ttl_s)
            except CacheError as err:
                log.debug("could not renew the build lease of %s: %s", self.key[:12], err)
                continue
            if not held and not self.lost:
                self.lost = True
                log.warning("the build lease of %s expired while building (a stall longer than %.0f s); another "
                            "worker may build it too, which is safe", self.key[:12], self.ttl_s)

    def __enter__(self) -> _Renewer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.cache.release_lease(self.key, self.token)
        except CacheError as err:  # it expires by itself
            log.debug("could not release the build lease of %s: %s", self.key[:12], err)


def get_or_build(cache: Cache, key: str, load: Callable[[], T | None], build: Callable[[], T], *,
                 wait_s: float | None = None, counters: str = "") -> tuple[T, str]:
    """Return the artifact for ``key`` from ``cache``, building it at most once across the fleet.

    Args:
        cache: the cache; its ``supports_leases`` decides whether builds are coordinated.
        key: the artifact key (64 hex).
        load: returns the stored artifact, or None on a miss.  Called once first, then on each poll.
        build: compiles and stores the artifact, and returns it (called by at most one worker at a time while
            the lease holds).
        wait_s: seconds to wait for another worker's build before building here (default: ``cache.wait_s``).
        counters: a prefix for the counters this counts (``"function_"``: whole-function artifacts are counted
            apart from graph artifacts).

    Returns:
        ``(artifact, outcome)``; outcome is ``"hit"`` (stored already), ``"built"`` (built here, under the lease
        or without one), ``"waited"`` (another worker built it while this one waited) or ``"takeover"`` (built
        here after another worker's lease expired unfinished).  Counts ``misses``, ``waits`` and
        ``takeovers`` in the cache; ``load``/``build`` count hits and builds.

    Raises:
        whatever ``build`` raises (the lease is released first).  Cache failures never propagate.
    """
    art = load()
    if art is not None:
        return art, "hit"
    _incr(cache, **{counters + "misses": 1})
    if not cache.supports_leases:
        return build(), "built"
    deadline = time.monotonic() + (cache.wait_s if wait_s is None else wait_s)
    pause = POLL_FIRST_S
    saw_holder = False  # another worker's lease was seen (we waited, or it vanished between two looks)
    may_lease = not cache.read_only  # a read-only cache (or remote tier) only watches others' leases
    while True:
        token = None
        if may_lease:
            try:
                token = cache.acquire_lease(key)
            except CacheReadOnlyError:
                may_lease = False
            except CacheError as err:
                log.info("no build lease for %s (%s); building here", key[:12], err)
                return build(), "built"
            else:
                saw_holder = saw_holder or token is None
        if token is not None:
            with _Renewer(cache, key, token, cache.lease_ttl_s):
                if saw_holder:  # the holder may have finished between our last look and taking the lease
                    art = load()
                    if art is not None:
                        _incr(cache, **{counters + "waits": 1})
                        return art, "waited"
                    log.warning("the build lease of %s expired without a stored artifact (its builder died or "
                                "stalled); building it here", key[:12])
                    _incr(cache, **{counters + "takeovers": 1})
                art = build()
            return art, "takeover" if saw_holder else "built"
        try:
            held = cache.lease_held(key)
        except CacheError as err:
            log.info("cannot see the build lease of %s (%s); building here", key[:12], err)
            return build(), "built"
        if not held:
            if not may_lease:  # nobody is building it and we may not take the lease: build for ourselves
                return build(), "built"
            continue  # released or expired just now: look again at the ref (under the lease) and take over
        if pause == POLL_FIRST_S:
            log.info("waiting for another worker's build of %s (up to %.0f s)", key[:12], deadline - time.monotonic())
        saw_holder = True
        time.sleep(pause)
        pause = min(POLL_MAX_S, pause * 2)
        art = load()
        if art is not None:
            _incr(cache, **{counters + "waits": 1})
            return art, "waited"
        if time.monotonic() > deadline:
            log.warning("gave up waiting for another worker's build of %s; building it here", key[:12])
            return build(), "built"


def _incr(cache: Cache, **counts: int) -> None:
    try:
        cache.incr(**counts)
    except Exception as err:  # noqa: BLE001 - counting never fails a call
        log.debug("counter update failed on %s: %s", cache.url, err)
