"""Prometheus metrics: what this process did through precompile, and what a cache's counters say.

This process (a serving worker, a warmup job) records every lookup as it happens, in plain Python (recording
imports nothing; ``prometheus_client`` is imported when metrics are collected):

| metric | type | labels |
|---|---|---|
| ``precompile_lookups_total`` | counter | ``outcome``: hit, built, waited (another worker built it), takeover |
| ``precompile_hits_total`` / ``precompile_builds_total`` / ``precompile_waits_total`` | counter | |
| ``precompile_misses_total`` | counter | ``reason``: absent, damaged, cache_error, load_failed, untrusted (and what a newer cache layer adds) |
| ``precompile_loads_total`` | counter | ``path``: fast (carried binaries), portable (Inductor's cache entries) |
| ``precompile_load_seconds`` | histogram | ``path``: seconds from lookup to a callable artifact |
| ``precompile_build_seconds`` | histogram | Inductor compile seconds of artifacts built here |
| ``precompile_loaded_bytes_total`` / ``precompile_built_bytes_total`` | counter | logical (uncompressed) bytes of the artifacts' parts |
| ``precompile_remote_errors_total`` | counter | failures of a tiered cache's remote tier, served locally |
| ``precompile_untrusted_total`` | counter | ``reason``: artifacts refused by the trust check, never run (unsigned, unknown_key, bad_signature, malformed, unsafe_path) |

The counters without labels are exported from the start at 0, so that a ratio of them (the hit rate) exists
before its first hit.  They live in precompile's own registry (:func:`registry`), never in ``prometheus_client``'s
global default, so importing precompile changes nothing in a host's metrics.  A serving process exposes them on
the port ``PRECOMPILE_METRICS_PORT`` names (:func:`serve_configured`: from its first recorded lookup or load; off
by default), with :func:`serve` (an HTTP endpoint on a port of its choosing), or adds them to the registry it
already serves with :func:`register`.  ``deploy/monitoring/`` holds a Grafana dashboard and Prometheus alert
rules over them.
Every layer counts into a cache through :func:`safe_incr` (never raising) and reports a failing cache once
through :func:`warn_once`.

:func:`cache_exposition` is what ``precompile stats --format prometheus`` prints: a cache's persisted counters
(fleet-wide for Redis), as ``precompile_cache_<counter>_total{cache="<url>"}``, plus ``hit_rate``,
``bytes_stored`` and ``max_bytes`` gauges, one series per tier of a tiered cache; for a textfile collector or a
sidecar.
"""

from __future__ import annotations

import logging
import os
import threading
from bisect import bisect_left
from typing import TYPE_CHECKING, Any

from precompile import config

if TYPE_CHECKING:  # pragma: no cover
    from prometheus_client import CollectorRegistry

    from cache_backends.base import Cache

#: Histogram buckets, seconds: a fast CPU load takes milliseconds, a compile tens of seconds to minutes.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
           600.0)

_DOCS = {
    "lookups": ("counter", "Artifact lookups by outcome (hit, built, waited, takeover)", ("outcome",)),
    "hits": ("counter", "Lookups served by a stored artifact", ()),
    "misses": ("counter", "Lookups that found no usable stored artifact, by reason", ("reason",)),
    "builds": ("counter", "Artifacts compiled by this process (built or taken over)", ()),
    "waits": ("counter", "Misses served by waiting for another worker's build", ()),
    "loads": ("counter", "Stored artifacts turned into callables, by path (fast or portable)", ("path",)),
    "loaded_bytes": ("counter", "Logical (uncompressed) bytes of the artifacts loaded", ()),
    "built_bytes": ("counter", "Logical (uncompressed) bytes of the artifacts built", ()),
    "remote_errors": ("counter", "Failures of a tiered cache's remote tier (served from the local tier)", ()),
    "untrusted": ("counter", "Artifacts refused by the trust check (never run), by reason", ("reason",)),
    "load_seconds": ("histogram", "Seconds from a lookup to a callable stored artifact, by path", ("path",)),
    "build_seconds": ("histogram", "Inductor compile seconds of the artifacts built by this process", ()),
}

_lock = threading.Lock()
_counts: dict[tuple[str, tuple[str, ...]], float] = {}
_hists: dict[tuple[str, tuple[str, ...]], list[float]] = {}  # bucket counts (+Inf last), then the sum
_notes = threading.local()
_registry: CollectorRegistry | None = None
_served: tuple[int, Any] | None = None  # (pid, what serve returned, or None if it failed) of serve_configured
_serve_lock = threading.Lock()

log = logging.getLogger("precompile")


def _inc(name: str, labels: tuple[str, ...] = (), value: float = 1.0) -> None:
    with _lock:
        _counts[(name, labels)] = _counts.get((name, labels), 0.0) + value


def _observe(name: str, seconds: float, labels: tuple[str, ...] = ()) -> None:
    with _lock:
        h = _hists.setdefault((name, labels), [0.0] * (len(BUCKETS) + 2))
        h[bisect_left(BUCKETS, seconds)] += 1
        h[-1] += seconds


# -------------------------------------------------------------------------------------------- recording
def note_miss(reason: str) -> None:
    """Remember why the current lookup on this thread missed (the first reason wins until it is taken)."""
    if getattr(_notes, "reason", None) is None:
        _notes.reason = reason


def note_untrusted(reason: str) -> None:
    """Count an artifact of a cache refused by the trust check (``reason``: a verdict's status, or
    ``"unsafe_path"``), and note ``untrusted`` as the current lookup's miss reason."""
    count_untrusted(reason)
    note_miss("untrusted")


def count_untrusted(reason: str) -> None:
    """Count an artifact refused by the trust check (``reason`` as :func:`note_untrusted`)."""
    _inc("untrusted", (reason,))


def take_miss_reason() -> str | None:
    """The reason noted on this thread since the last call (None if none), and forget it."""
    reason = getattr(_notes, "reason", None)
    _notes.reason = None
    return reason


def record_lookup(outcome: str, art: Any, seconds: float, miss_reason: str | None = None,
                  remote_errors: int = 0) -> None:
    """Record one ``standalone_compile`` lookup.

    Args:
        outcome: ``"hit"``, ``"built"``, ``"waited"`` or ``"takeover"``.
        art: the artifact returned (its manifest gives the bytes and build seconds, ``engine_kind`` the path).
        seconds: wall seconds of the whole lookup.
        miss_reason: why a non-hit missed (default ``"absent"``).
        remote_errors: remote-tier failures during the lookup.

    Raises:
        ConfigError: ``PRECOMPILE_METRICS_PORT`` holds a bad value (:func:`serve_configured`).
    """
    serve_configured()
    _inc("lookups", (outcome,))
    if outcome != "hit":
        _inc("misses", (miss_reason or "absent",))
    if outcome in ("hit", "waited"):
        _inc("hits" if outcome == "hit" else "waits")
        record_load(art, seconds)
    else:
        _inc("builds")
        _inc("built_bytes", (), float(art.manifest.total_bytes()))
        _observe("build_seconds", float(art.manifest.build.get("seconds") or seconds))
    if remote_errors:
        _inc("remote_errors", (), float(remote_errors))


def record_load(art: Any, seconds: float) -> None:
    """Record a stored artifact turned into a callable in ``seconds`` (``art.engine_kind`` is the path).

    Raises:
        ConfigError: ``PRECOMPILE_METRICS_PORT`` holds a bad value (:func:`serve_configured`).
    """
    serve_configured()
    path = art.engine_kind if art.engine_kind in ("fast", "portable", "graph") else "other"
    _inc("loads", (path,))
    _inc("loaded_bytes", (), float(art.manifest.total_bytes()))
    _observe("load_seconds", seconds, (path,))


def snapshot() -> dict[str, Any]:
    """This process's metrics as plain data: ``{"counters": {"name{labels}": value}, "histograms": {...}}``."""
    with _lock:
        counters = {_series(n, lab): v for (n, lab), v in sorted(_counts.items())}
        hists = {_series(n, lab): {"count": sum(h[:-1]), "sum": h[-1]} for (n, lab), h in sorted(_hists.items())}
    return {"counters": counters, "histograms": hists}


def _series(name: str, labels: tuple[str, ...]) -> str:
    names = _DOCS[name][2]
    return name + ("{" + ",".join(f"{k}={v}" for k, v in zip(names, labels)) + "}" if labels else "")


# ----------------------------------------------------------------------------------------------- export
def _collector() -> Any:
    from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
    from prometheus_client.registry import Collector

    class ProcessCollector(Collector):
        """precompile's metrics of this process (module docstring)."""

        def collect(self):
            with _lock:
                counts, hists = dict(_counts), {k: list(v) for k, v in _hists.items()}
            for name, (kind, doc, label_names) in _DOCS.items():
                if kind == "counter":
                    fam = CounterMetricFamily(f"precompile_{name}", doc, labels=label_names)
                    for (n, labels), value in sorted(counts.items()):
                        if n == name:
                            fam.add_metric(labels, value)
                    if not label_names and (name, ()) not in counts:
                        fam.add_metric((), 0.0)  # a ratio of counters (the hit rate) exists before the first hit
                else:
                    fam = HistogramMetricFamily(f"precompile_{name}", doc, labels=label_names, unit="")
                    for (n, labels), h in sorted(hists.items()):
                        if n == name:
                            cumulative, buckets = 0.0, []
                            for bound, c in zip([*map(str, BUCKETS), "+Inf"], h[:-1]):
                                cumulative += c
                                buckets.append((bound, cumulative))
                            fam.add_metric(labels, buckets, h[-1])
                yield fam

    return ProcessCollector()


def registry() -> CollectorRegistry:
    """precompile's own registry, holding this process's metrics (created on first use)."""
    global _registry
    with _lock:
        if _registry is None:
            from prometheus_client import CollectorRegistry

            _registry = CollectorRegistry(auto_describe=False)
            _registry.register(_collector())
        return _registry


def register(into: CollectorRegistry) -> None:
    """Expose this process's precompile metrics on ``into`` too (e.g. the registry a server already serves).

    Raises:
        ValueError: ``into`` already has them.
    """
    into.register(_collector())


def serve(port: int, addr: str = "0.0.0.0") -> Any:
    """Serve :func:`registry` on ``http://addr:port/`` (any path, e.g. ``/metrics``) from a daemon thread;
    returns ``(server, thread)`` (``port=0`` picks a free port: ``server.server_port``).

    Raises:
        OSError: the port cannot be bound.
    """
    from prometheus_client import start_http_server

    return start_http_server(port, addr, registry=registry())


def serve_configured() -> Any:
    """Serve :func:`registry` on the port ``PRECOMPILE_METRICS_PORT`` names (all interfaces, any path, e.g.
    ``/metrics``), once per process; a no-op when the variable is unset.  Called by every recorded lookup and
    load, so a worker's endpoint is up from its first one; a server may call it at start to open it sooner.

    Returns:
        ``(server, thread)`` as :func:`serve`, or None when no endpoint is configured or the port could not be
        bound (logged once as a warning, e.g. a second process of the host asking for the same port: the
        process goes on without an endpoint).

    Raises:
        ConfigError: the variable is not a port number.
    """
    global _served
    port = config.metrics_port()
    if port is None:
        return None
    with _serve_lock:
        if _served is None or _served[0] != os.getpid():  # a forked child does not inherit the serving thread
            try:
                _served = (os.getpid(), serve(port))
                log.info("serving precompile's metrics on port %d (PRECOMPILE_METRICS_PORT)", port)
            except OSError as err:
                _served = (os.getpid(), None)
                log.warning("cannot serve precompile's metrics on port %d (PRECOMPILE_METRICS_PORT): %s; this "
                            "process exposes none. Give each process of a host its own port", port, err)
        return _served[1]


def exposition() -> bytes:
    """This process's metrics in Prometheus's text format."""
    from prometheus_client import generate_latest

    return generate_latest(registry())


def cache_exposition(cache: Cache) -> bytes:
    """A cache's counters and sizes in Prometheus's text format (module docstring); one series per tier.

    Never raises for a remote that fails: its counters are then the ones this process kept.
    """
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector

    from cache_backends.redaction import redact_url

    stats = cache.stats()
    tiers = stats.get("tiers") or [stats]

    class CacheCollector(Collector):
        def collect(self):
            families: dict[str, Any] = {}
            for tier in tiers:
                url = redact_url(tier.get("url", cache.url))  # a backend's stats may carry its URL as given
                for name, value in tier.items():
                    if isinstance(value, bool) or not isinstance(value, (int, float)):
                        continue
                    if name in ("hit_rate", "bytes_stored", "max_bytes"):
                        fam = families.setdefault(name, GaugeMetricFamily(
                            f"precompile_cache_{name}", _GAUGE_DOCS[name], labels=("cache",)))
                    elif isinstance(value, int) and name not in ("ttl_s", "chunk_bytes"):
                        fam = families.setdefault(name, CounterMetricFamily(
                            f"precompile_cache_{name}", f"Cache counter {name} (persisted by the cache)",
                            labels=("cache",)))
                    else:
                        continue
                    fam.add_metric((url,), float(value))
            yield from families.values()

    reg = CollectorRegistry(auto_describe=False)
    reg.register(CacheCollector())
    return generate_latest(reg)


_GAUGE_DOCS = {"hit_rate": "hits / (hits + misses) of the cache's counters",
               "bytes_stored": "Bytes the cache stores (compressed, as stored)",
               "max_bytes": "Size cap of the cache, bytes"}


def safe_incr(cache: Cache, **counts: int) -> None:
    """``cache.incr(**counts)``, never raising: a counter that cannot be updated is logged at debug level."""
    try:
        cache.incr(**counts)
    except Exception as err:  # noqa: BLE001 - counters must never fail a call
        log.debug("counter update failed on %s: %s", cache.url, err)


_warned: set[tuple[str, str]] = set()


def warn_once(cache: Cache, message: str, kind: str | None = None) -> None:
    """Log ``message`` as a warning once per cache URL and ``kind`` (default: the message's first 40 characters);
    repeats go to the debug level.  Give a ``kind`` for messages that name an artifact key, so that a cache that
    fails the same way for every key is reported once, not once per key."""
    tag = (cache.url, kind or message[:40])
    if tag not in _warned:
        _warned.add(tag)
        log.warning(message)
    else:
        log.debug(message)
