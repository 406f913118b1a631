"""Riding out a Redis Cluster failover: an operation retried, with backoff, until the cluster has promoted a replica.

When a master dies, its slots answer nothing (connections refused or reset, ``CLUSTERDOWN``, slots not covered,
a demoted master's ``READONLY``) until the cluster promotes one of its replicas: about ``cluster-node-timeout``
plus a second.  redis-py's cluster client reloads the slot map on such errors but retries at once, without
waiting, so on its own it gives up long before the promotion.  A :class:`~cache_backends.redis.cache.RedisCache`
method marked :func:`retrying` runs again, after a pause that doubles from :data:`FIRST_PAUSE_S` to
:data:`MAX_PAUSE_S` (with jitter, so that a fleet does not retry in step), until it succeeds or its cache's
``retry_s`` seconds have passed; only then is the server marked down (the breaker) and the call fails with
:class:`~precompile.errors.CacheUnavailableError`.

A timeout is never retried, by this module or by redis-py (cluster clients are built with no retries of their
own): a stalled node (SIGSTOP, a partition) costs one socket timeout in the masters' pass, and at most one more in
the replica pass, then the breakers.  Every operation retried is idempotent (reads, SETs of
content-addressed values, compare-and-set scripts; a lease is taken with one token for every try, so a try whose
reply was lost is found to be the caller's own).
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis.exceptions as rex

from precompile.errors import CacheUnavailableError

#: Seconds of the first pause before a retry; each next pause doubles, up to :data:`MAX_PAUSE_S`.
FIRST_PAUSE_S = 0.05
#: Longest pause between two tries, seconds.
MAX_PAUSE_S = 1.0

#: Errors that a failover causes and that end with it (never a timeout: see the module docstring).
FAILOVER_ERRORS: tuple[type[BaseException], ...] = (rex.ConnectionError, rex.ClusterError, rex.TryAgainError,
                                                    rex.ReadOnlyError, rex.AskError, rex.RedisClusterException,
                                                    ConnectionRefusedError, ConnectionResetError, BrokenPipeError)

F = TypeVar("F", bound=Callable[..., Any])

_scope = threading.local()


class FailoverPending(CacheUnavailableError):
    """A cluster operation failed the way a failover makes it fail, before its retry deadline: the outermost
    :func:`retrying` method catches it, pauses and runs again.  Never leaves a ``RedisCache`` method."""


def is_failover(err: BaseException) -> bool:
    """True for an error that a cluster failover causes and that ends with it; False for a timeout and for rejected
    credentials."""
    if not isinstance(err, FAILOVER_ERRORS):
        return False
    seen: BaseException | None = err
    for _ in range(8):  # redis-py raises "cluster cannot be connected" from the timeout that caused it
        if seen is None:
            break
        if isinstance(seen, (rex.TimeoutError, TimeoutError, rex.AuthenticationError)):
            return False
        seen = seen.__cause__ or seen.__context__
    return True


def current_deadline() -> float | None:
    """``time.monotonic()`` deadline of the :func:`retrying` call running on this thread, or None."""
    return getattr(_scope, "deadline", None)


def retrying(method: F) -> F:
    """Run a ``RedisCache`` method again while it raises :class:`FailoverPending`, pausing with backoff, for at
    most the cache's ``retry_s`` seconds (``_talk`` stops raising it at the deadline).  A call made inside another
    :func:`retrying` call runs once: only the outermost retries.  Retries are counted under ``failover_retries``."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.retry_s <= 0 or current_deadline() is not None:
            return method(self, *args, **kwargs)
        _scope.deadline = time.monotonic() + self.retry_s
        pause = FIRST_PAUSE_S
        try:
            while True:
                try:
                    return method(self, *args, **kwargs)
                except FailoverPending as err:
                    left = _scope.deadline - time.monotonic()
                    self._warn_once("failover", f"Redis cluster {self.url} is failing over ({err}); "
                                                f"retrying for up to {max(left, 0):.1f} s")
                    self._count(failover_retries=1)
                    time.sleep(max(0.0, min(pause * random.uniform(0.5, 1.0), left)))
                    pause = min(pause * 2, MAX_PAUSE_S)
        finally:
            _scope.deadline = None

    return run  # type: ignore[return-value]
