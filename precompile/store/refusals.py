"""Cache entries this process refused, remembered so that one planted entry costs one parse.

A worker waiting for another's build reads the key's ref on every poll (:mod:`precompile.store.coordination`).
An entry it refuses (unsigned or badly signed under verify keys, a manifest that is not JSON or is malformed, one
that names another key, one that carries host code where none is allowed) is refused again for the same reasons
on the next poll, after reading and parsing its manifest again: up to 16 MiB and a width-bomb's allocations each
time.  So the refusal is remembered, keyed by the artifact key and the manifest digest the ref names (the
manifest is content-addressed: the same digest is the same bytes) and by the context that decided it (the cache,
the verify keys and ``PRECOMPILE_REQUIRE_NO_HOST_CODE``), for :data:`REFUSED_TTL_S` seconds.  Until then the ref is read
(one small read) and, naming that digest, is a miss without anything more.  A new ref (a rebuild, another digest)
is read as usual.  Only what the manifest's bytes decide is remembered: a cache failure or a part found missing is
not (a part can come back; a refused manifest cannot change).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any


#: Seconds a refusal is remembered.
REFUSED_TTL_S = 600.0
#: Most refusals remembered at once (the oldest are forgotten first).
MAX_REMEMBERED = 4096

_lock = threading.Lock()
#: (key, manifest digest, context) -> (time.monotonic() it is forgotten, why, miss reason or None)
_refused: OrderedDict[tuple[str, str, Any], tuple[float, str, str | None]] = OrderedDict()


def context(cache: Any, policy: Any) -> tuple[str, frozenset[str], bool]:
    """Where a refusal holds besides the manifest's bytes: ``cache``'s URL (each cache counts its own refusals),
    ``policy``'s verify key ids (:class:`precompile.manifest.trust.Policy`) and whether it refuses host code.
    """
    return str(cache.url), frozenset(policy.verify), bool(policy.no_host_code)


def remember(key: str, digest: str | None, ctx: Any, why: str, miss_reason: str | None = None) -> None:
    """Remember that the entry ``key`` whose ref names manifest ``digest`` was refused under ``ctx`` (from
    :func:`context`) for ``why`` (a sentence); ``miss_reason`` is noted again for each lookup it answers
    (:func:`precompile.metrics.note_miss`).  Nothing is remembered without a digest."""
    if not digest:
        return
    with _lock:
        _refused[(key, digest, ctx)] = (time.monotonic() + REFUSED_TTL_S, why, miss_reason)
        _refused.move_to_end((key, digest, ctx))
        while len(_refused) > MAX_REMEMBERED:
            _refused.popitem(last=False)


def recall(key: str, digest: str, ctx: Any) -> tuple[str, str | None] | None:
    """``(why, miss reason)`` if the entry ``key`` naming manifest ``digest`` was refused under ``ctx`` less than
    :data:`REFUSED_TTL_S` seconds ago, else None."""
    with _lock:
        found = _refused.get((key, digest, ctx))
        if found is None:
            return None
        if found[0] <= time.monotonic():
            del _refused[(key, digest, ctx)]
            return None
        return found[1], found[2]


def forget_all() -> None:
    """Forget every refusal (tests; a process that changed its keys does not need it: they are in the key)."""
    with _lock:
        _refused.clear()
