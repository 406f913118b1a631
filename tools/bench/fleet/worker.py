"""One fleet worker: a fresh process that gets ``K`` small artifacts through a shared cache, as a serving worker would.

Usage (started by :mod:`tools.bench.fleet.storm`)::

    python -m tools.bench.fleet.worker --url URL --ready DIR --go FILE --done DIR --index I --keys K [--building DIR]

Before GO (not timed): imports torch and precompile, builds the ``K`` graphs (:func:`graph`: an MLP of 8 blocks
of width ``64 + 32 k`` for key ``k``, traced with ``make_fx``, weights as inputs) and their eager outputs, touches
``READY/<pid>``, then waits for ``GO`` (the parent writes its ``time.time()`` there once every worker is ready).
After GO: the cache is opened once (``open_cache(URL)``, as ``precompile.backend(cache=URL)`` does, and as it
does, a cache that cannot be opened is a warning and compiles without it), then
``precompile.standalone_compile(graph, inputs, cache=cache)`` and one call, for each key in the order
``I, I+1, ... (mod K)`` (so that the builds of a cold storm run side by side), then touches ``DONE/<pid>``.  A
watcher thread touches ``BUILDING/<pid>`` the moment Inductor's compiler is imported in this process (a load never
imports it; a build does): that is how the parent finds a build-lease holder to kill.

Prints one JSON line: per key the outcome (``hit``, ``built``, ``waited``, ``takeover``), the seconds from GO to
that key's first output and whether it is ``allclose`` to eager; ``ttfo_s`` (GO to the last key's first output),
CPU seconds after GO, peak RSS.
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
from pathlib import Path

#: Eager vs compiled: Inductor's fused CPU kernels round differently from eager's ops.
RTOL, ATOL = 1e-4, 1e-5
COMPILER = "torch._inductor.compile_fx"


#: The activations the blocks of a graph rotate through (each a different C++ kernel).
ACTIVATIONS = ("GELU", "SiLU", "Tanh", "Mish", "Hardswish", "ELU")
#: Blocks per graph: 8 make an artifact of about 0.9 MB (0.3 MB as zstd in Redis) compiled in ~25 CPU s here.
BLOCKS = 8


def graph(k: int):
    """``(GraphModule, inputs)`` of key ``k``: ``Linear(64, h)``, then :data:`BLOCKS` blocks of activation,
    ``LayerNorm``, ``Linear(h, h)``, then ``Linear(h, 64)``, with ``h = 64 + 32 k``; traced with ``make_fx``, the
    weights as inputs."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    h = 64 + 32 * k
    torch.manual_seed(k)
    layers = [torch.nn.Linear(64, h)]
    for b in range(BLOCKS):
        layers += [getattr(torch.nn, ACTIVATIONS[(b + k) % len(ACTIVATIONS)])(), torch.nn.LayerNorm(h),
                   torch.nn.Linear(h, h)]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(h, 64))
    names = [n for n, _ in model.named_parameters()]
    params = [p.detach() for _, p in model.named_parameters()]
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(100 + k))

    def forward(*args):
        return (torch.func.functional_call(model, dict(zip(names, args[:-1])), (args[-1],)),)

    return make_fx(forward)(*params, x), [*params, x]


def _watch_compiler(building: Path, stop: threading.Event) -> None:
    while not stop.wait(0.01):
        if COMPILER in sys.modules:
            building.mkdir(parents=True, exist_ok=True)
            (building / str(os.getpid())).touch()
            return


def _cpu_s() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    for name in ("--url", "--ready", "--go", "--done"):
        p.add_argument(name, required=True)
    p.add_argument("--building", default=None)
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--keys", type=int, default=4)
    p.add_argument("--timeout", type=float, default=600)
    a = p.parse_args(argv)
    import torch

    import precompile
    from cache_backends import open_cache
    from cache_backends.redaction import redact_url
    from precompile.config import setup_logging
    from precompile.errors import CacheError, CacheURLError

    setup_logging(quiet=True)
    order = [(a.index + i) % a.keys for i in range(a.keys)]
    graphs = {k: graph(k) for k in order}
    with torch.no_grad():
        eager = {k: gm(*inputs) for k, (gm, inputs) in graphs.items()}
    stop = threading.Event()
    if a.building:
        threading.Thread(target=_watch_compiler, args=(Path(a.building), stop), daemon=True).start()
    Path(a.ready).mkdir(parents=True, exist_ok=True)
    (Path(a.ready) / str(os.getpid())).touch()
    go, deadline = Path(a.go), time.monotonic() + a.timeout
    while not go.exists() or not go.read_text().strip():
        if time.monotonic() > deadline:
            print("the GO file never appeared", file=sys.stderr)
            return 2
        time.sleep(0.002)
    go_at = float(go.read_text())
    cpu0 = _cpu_s()
    try:  # once per process, as precompile.backend(cache=URL) does, and with its policy on failure
        cache = open_cache(a.url)
    except CacheURLError:
        raise
    except CacheError as err:  # an outage at start (a cluster's seed node down): compile uncached
        logging.getLogger("precompile").warning("cache %s cannot be opened (%s); compiling without it",
                                                redact_url(a.url), err)
        cache = None
    keys = []
    for k in order:
        gm, inputs = graphs[k]
        art = precompile.standalone_compile(gm, inputs, cache=cache)
        with torch.no_grad():
            got = art(*inputs)
        done_at = time.time()
        same = all(torch.allclose(g, w, rtol=RTOL, atol=ATOL) for g, w in zip(got, eager[k]))
        diff = max(float((g - w).abs().max()) for g, w in zip(got, eager[k]))
        keys.append({"k": k, "key": art.key, "outcome": art.outcome, "seconds": done_at - go_at, "allclose": same,
                     "max_abs_diff": diff, "artifact_bytes": art.manifest.total_bytes()})
    stop.set()
    Path(a.done).mkdir(parents=True, exist_ok=True)
    (Path(a.done) / str(os.getpid())).touch()
    print(json.dumps({"pid": os.getpid(), "index": a.index, "keys": keys, "ttfo_s": max(r["seconds"] for r in keys),
                      "cpu_s": _cpu_s() - cpu0, "compiled": COMPILER in sys.modules,
                      "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
