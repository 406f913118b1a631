"""Fetch-only clients: many in one process, each asking the cache what a serving worker asks of it, and no more.

Usage (started by :mod:`tools.bench.fleet.fetchonly`)::

    python -m tools.bench.fleet.client --url URL --keys K1,K2,... --clients C --first I --ready DIR --go FILE
        --done DIR --stop FILE --out FILE

``C`` threads, one client each (client ``I``, ``I+1``...), wait for ``GO`` (the parent writes its ``time.time()``
there once every process is ready).  From GO each client, in its own thread:

- opens the cache once (``open_with_policy(URL)``: its own Redis client and connections, as a worker's process has);
- for each key, in the order ``i, i+1, ... (mod K)``, does what ``precompile.store.cache_io.load_from_cache``
  does before a load: reads the ref, the manifest (at most ``MAX_MANIFEST_BYTES``), checks its signature with the
  trust policy (``PRECOMPILE_VERIFY_KEYS``), parses it (``Manifest.from_dict``: structure and names), reads and
  verifies the blobs a load needs, each bounded by the size the manifest records, and checks that the other parts
  exist.  No torch is imported and nothing is loaded or run.  It is a copy of those reads, not a call:
  ``cache_io`` imports torch.  Left out: the ``PRECOMPILE_REQUIRE_NO_HOST_CODE`` branch (which reads fewer parts),
  the memo of refused entries (``precompile.store.refusals``) and dropping a damaged ref; a change to what
  ``load_from_cache``, ``precompile.store.entries.read_entry`` or ``part_bounds`` read belongs here too.

A key is a ``hit`` when all of that succeeded; ``absent`` (no ref), ``damaged`` (a part missing or corrupt, the
manifest naming another key or not parsing) and ``untrusted`` (the signature refused) are what a worker would build
(counted as builds); ``error`` is a cache failure (``CacheError``), and a ``timeout`` when a socket timed out.

When every client is done the process touches ``DONE/<pid>``, writes one JSON document to ``OUT`` (per client: the
seconds from GO to its last key verified, the seconds its cache took to open, outcomes, verified bytes; per process:
CPU seconds, peak RSS, the circuit breakers that tripped) and keeps every cache open, so that the parent samples
the connections of all clients at once, until ``STOP`` exists.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import threading
import time
from collections import Counter
from pathlib import Path

#: Outcomes a worker would follow with a build.
BUILDS = ("absent", "damaged", "untrusted")


def _timed_out(err: BaseException) -> bool:
    """True when a socket timeout is in ``err``'s chain (``CacheUnavailableError`` from a ``TimeoutError``)."""
    while err is not None:
        if isinstance(err, TimeoutError) or type(err).__name__ == "TimeoutError":
            return True
        err = err.__cause__ or err.__context__
    return False


def fetch_key(cache, policy, key: str) -> tuple[str, int]:
    """``(outcome, verified bytes)`` of one key: what ``load_from_cache`` reads and checks, nothing run.

    Raises:
        CacheError: the cache failed (the caller counts an error).
    """
    from cache_backends.base import MISS
    from cache_backends.bounded import MAX_MANIFEST_BYTES
    from precompile.manifest.manifest import Manifest, load_json
    from precompile.errors import ArtifactFormatError, UnsafePathError

    digest = cache.get_ref(key)
    if digest is MISS:
        return "absent", 0
    raw = cache.get_blob(digest, MAX_MANIFEST_BYTES)
    if raw is MISS:
        return "damaged", 0
    try:
        doc = load_json(raw)
        if not policy.check(doc).ok:
            return "untrusted", 0
        manifest = Manifest.from_dict(doc)
    except (ArtifactFormatError, UnsafePathError, KeyError, TypeError, ValueError):
        return "damaged", 0
    if manifest.key != key:
        return "damaged", 0
    bounds = {d: int(info["size"]) for d, info in manifest.blobs.items()}
    got = cache.get_blobs(manifest.load_digests(), bounds)
    if any(v is MISS for v in got.values()):
        return "damaged", 0
    rest = [d for d in manifest.part_digests() if d not in got]
    if not all(cache.has_blobs(rest).values()):
        return "damaged", 0
    return "hit", len(raw) + sum(len(v) for v in got.values())


class Client(threading.Thread):
    """One client: opens the cache at GO, fetches every key, keeps the cache open until told to close."""

    def __init__(self, index: int, url: str, keys: list[str], go: threading.Event, go_at: list[float]):
        super().__init__(name=f"client-{index}", daemon=True)
        self.index, self.url, self.go, self.go_at = index, url, go, go_at
        self.order = [keys[(index + i) % len(keys)] for i in range(len(keys))]
        self.cache = None
        self.report: dict = {"client": index, "outcomes": {}, "bytes": 0, "errors": [], "timeouts": 0}

    def run(self) -> None:
        from precompile.errors import CacheError
        from precompile.store.opening import open_with_policy

        self.go.wait()
        outcomes: Counter[str] = Counter()
        r = self.report
        try:
            self.cache, policy = open_with_policy(self.url)
            r["open_s"] = time.time() - self.go_at[0]
            for key in self.order:
                try:
                    outcome, n = fetch_key(self.cache, policy, key)
                except CacheError as err:
                    outcome, n = "error", 0
                    r["timeouts"] += _timed_out(err)
                    r["errors"].append(f"{key[:12]}: {type(err).__name__}: {str(err)[:300]}")
                outcomes[outcome] += 1
                r["bytes"] += n
        except Exception as err:  # noqa: BLE001 - a client that fails is counted, never a crashed process
            outcomes["error"] += len(self.order) - sum(outcomes.values())
            r["timeouts"] += _timed_out(err)
            r["errors"].append(f"{type(err).__name__}: {str(err)[:300]}")
        r["seconds"] = time.time() - self.go_at[0]
        r["outcomes"] = dict(outcomes)


def _breakers_tripped() -> list[str]:
    """The servers whose circuit breaker (shared by every cache of this process) tripped during the run."""
    from cache_backends.redis.health import Breaker

    with Breaker._all_lock:
        return sorted(name for name, b in Breaker._all.items() if b.down_until > 0)


def _wait_file(path: Path, deadline: float) -> str:
    while not path.exists() or not path.read_text().strip():
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} never appeared")
        time.sleep(0.002)
    return path.read_text()


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    for name in ("--url", "--keys", "--ready", "--go", "--done", "--stop", "--out"):
        p.add_argument(name, required=True)
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--timeout", type=float, default=900)
    a = p.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # each client holds a connection per node it reads
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else max(soft, 65536), hard))
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    # imported before GO, as a worker's imports are (the opener and the trust check: their first use imports them)
    import cache_backends.redis.cache  # noqa: F401
    import cache_backends.registry  # noqa: F401
    import precompile.store.opening  # noqa: F401
    import precompile.manifest.manifest  # noqa: F401
    from precompile.manifest import trust

    trust.policy()  # reads and parses PRECOMPILE_VERIFY_KEYS once, as a worker's first load would

    keys = a.keys.split(",")
    go, go_at = threading.Event(), [0.0]
    clients = [Client(a.first + i, a.url, keys, go, go_at) for i in range(a.clients)]
    for c in clients:
        c.start()
    Path(a.ready).mkdir(parents=True, exist_ok=True)
    (Path(a.ready) / str(os.getpid())).touch()
    deadline = time.monotonic() + a.timeout
    go_at[0] = float(_wait_file(Path(a.go), deadline))
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    go.set()
    for c in clients:
        c.join(max(1.0, deadline - time.monotonic()))
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    doc = {"pid": os.getpid(), "clients": [c.report for c in clients], "breakers_tripped": _breakers_tripped(),
           "cpu_s": cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime,
           "rss_mib": cpu1.ru_maxrss / 1024, "unfinished": sum(c.is_alive() for c in clients)}
    Path(a.out).write_text(json.dumps(doc))
    Path(a.done).mkdir(parents=True, exist_ok=True)
    (Path(a.done) / str(os.getpid())).touch()
    _wait_file(Path(a.stop), time.monotonic() + a.timeout)
    for c in clients:
        if c.cache is not None:
            c.cache.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
