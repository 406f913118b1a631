"""One load per key per process: later lookups of a key this process loaded or built share that artifact.

vLLM splits a model at its attention ops into pieces and compiles each piece for each compile range; at depth the
pieces between two attention ops are one graph, so 28 of a 28-layer model's 29 pieces share one key.  Without
sharing, each of them reads the entry again, verifies it again and loads its kernels again.  With it, the first
lookup of a key reads, verifies and loads; every later lookup of the same key (under the same trust) gets a sibling
:class:`~precompile.loader.artifact.Artifact`: the same manifest, blobs and engine, its own bound weights, input
checks and call counters.

Why sharing is safe:

- A key names content: the sha256 of the canonical graph, the input specs, the options, the ambient state and the
  environment (:mod:`precompile.key.plan`).  Two graphs with one key compile to one thing.  Weights and constants
  are inputs (a ``get_attr`` tensor becomes a placeholder bound to the caller's tensor,
  :func:`precompile.key.graph.normalize_graph`), so each sibling binds its own.
- The engine keeps nothing between calls: Inductor's wrapper ``call`` (the fast and the portable path) and the graph
  engine allocate their outputs on every call and read only their arguments; the kernels they load are immutable.
  So each piece keeps its own inputs and outputs, and two pieces may run at once from two threads
  (tests/store/test_shared_loads.py checks outputs against eager, interleaved and concurrent).
- Entries are keyed by the key, the trust it was verified under (the verify keys' ids and the no-host-code
  requirement, :func:`trust_id`) and the open cache it came from: a call with a stricter policy never receives an
  entry a laxer one accepted, and a caller that opens a cache anew (a URL given to each call) reads it anew, so
  what another handle of the process loaded never hides a damaged or replaced entry from it.  A caller that holds
  one cache for many graphs (vLLM's adaptor, ``precompile.backend``) shares.
- Entries are held weakly: an entry lives as long as some artifact that shares it, no longer.

Counted as a hit (``hits``) like any other; only the reading, verifying and loading are skipped.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from precompile.loader.artifact import Artifact
    from precompile.manifest.trust import Policy

_lock = threading.Lock()
_entries: weakref.WeakValueDictionary[tuple[str, Any, int], Artifact] = weakref.WeakValueDictionary()
_key_locks: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


class _KeyLock:
    """A lock for one key (weakly held in :data:`_key_locks`; a plain ``threading.Lock`` cannot be)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()


def trust_id(policy: Policy | None) -> tuple[frozenset[str], bool]:
    """What of a trust policy decides whether an entry may load: the ids of its verify keys and its no-host-code
    requirement (:class:`precompile.manifest.trust.Policy`).  None (no policy resolved) is the empty policy."""
    if policy is None:
        return frozenset(), False
    return frozenset(policy.verify), bool(policy.no_host_code)


@contextlib.contextmanager
def loading(key: str) -> Iterator[None]:
    """Hold the key's lock while the block reads and loads it: two threads that miss the shared entry of one key
    at once read the cache once (the second finds the first's entry when it gets the lock)."""
    with _lock:
        holder = _key_locks.get(key)
        if holder is None:
            holder = _key_locks[key] = _KeyLock()
    with holder.lock:
        yield


def sibling(key: str, policy: Policy | None, *, bound: dict[int, Any] | None = None, cache: Any = None
            ) -> Artifact | None:
    """A new artifact sharing the loaded entry of ``key`` under ``policy``'s trust, or None if this process has none.

    Args:
        key: the artifact key (64 hex).
        policy: the call's trust policy (see :func:`trust_id`).
        bound: the caller's weights by placeholder index (each sibling binds its own).
        cache: the open cache the caller looks in (the entry must come from the same one; counted in, as a load
            from it is).
    """
    with _lock:
        first = _entries.get((key, trust_id(policy), id(cache)))
    return None if first is None else first.sibling(bound=bound, cache=cache)


def remember(art: Artifact, policy: Policy | None, cache: Any) -> None:
    """Offer ``art`` (its engine built, so a failed load is never shared) to later lookups of its key under
    ``policy``'s trust in the open cache ``cache`` (held by the entry: its id is not reused while the entry lives).
    A key already held keeps its first entry."""
    if art.engine_kind is None:
        raise ValueError(f"artifact {art.key[:12]} has no engine yet; only a loaded artifact can be shared")
    art.shared_cache = cache  # alive with the entry, so no other object takes its id meanwhile
    with _lock:
        _entries.setdefault((art.key, trust_id(policy), id(cache)), art)


def held() -> int:
    """How many entries this process holds now (each a key x trust, alive while an artifact shares it)."""
    with _lock:
        return len(_entries)


def forget() -> None:
    """Drop every entry (artifacts already handed out keep working): the next lookup of each key reads the cache."""
    with _lock:
        _entries.clear()


def load(key: str, cache: Any, policy: Policy | None, *, bound: dict[int, Any] | None = None,
         check_env: bool = True) -> Artifact | None:
    """The artifact ``key`` from the open ``cache``: a sibling of this process's entry for it, or read, verified
    and loaded (its engine built) and offered to later lookups; None on a miss (an entry whose engine fails to
    load is one too: logged once, counted under ``errors``).  Holds the key's lock (:func:`loading`) throughout.

    Args:
        key: the artifact key (64 hex).
        cache: the open cache.
        policy: the trust policy it was opened with.
        bound: the caller's weights by placeholder index.
        check_env: compare the stored manifest's environment with this process's (False only for a key computed
            here, from this environment).

    Raises:
        EnvironmentMismatchError: ``check_env`` and the stored artifact was built for another environment.
    """
    import logging
    import time

    from precompile import metrics
    from precompile.metrics import safe_incr, warn_once
    from precompile.store.cache_io import load_from_cache

    log = logging.getLogger("precompile")
    start = time.perf_counter()
    with loading(key):
        art = sibling(key, policy, bound=bound, cache=cache)
        if art is not None:
            log.info("cache hit %s (%s): shared with an earlier load of this process", key[:12], cache.url)
            return art
        art = load_from_cache(key, cache, bound=bound, check_env=check_env, policy=policy)
        if art is None:
            return None
        try:
            art.engine  # noqa: B018 - build the callable now, so the load time is honest and failures are a miss
        except Exception as err:  # noqa: BLE001 - a stored artifact that does not load is rebuilt
            warn_once(cache, f"artifact {key[:12]} from {cache.url} failed to load ({type(err).__name__}: {err}); "
                             "rebuilding it", kind="engine load")
            safe_incr(cache, errors=1)
            metrics.note_miss("load_failed")
            return None
        remember(art, policy, cache)
    art.load_seconds = time.perf_counter() - start
    log.info("cache hit %s (%s) in %.3f s", key[:12], cache.url, art.load_seconds)
    return art
