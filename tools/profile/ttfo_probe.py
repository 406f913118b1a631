#!/usr/bin/env python
"""Where a GPU worker's time to first output goes, and what overlaps: one stored artifact, fresh processes.

Scenarios (each a fresh process; ``import torch``, ``import precompile``, reading the inputs and the manifest's
recorded library calls are not timed; every step is synced):

- ``plain``: ``precompile.load``, first call, second call (``PRECOMPILE_PRIME=off``).
- ``prime``: the same with ``PRECOMPILE_PRIME=all`` (the replay of :mod:`precompile.inductor.load.prime` in a thread
  the load starts once it has verified the manifest, before it reads the blobs).
- ``early``: the replay thread started before ``precompile.load`` (before even the manifest is read), the first
  call after it ends.
- ``serial``: the replay run to its end first, then the load, then the first call: the work without overlap.
- ``calls``: the recorded library calls alone, one at a time, each timed on its first and second run, after
  ``torch.cuda.current_blas_handle()`` (cuBLAS handle and workspace) is timed alone.
- ``profile``: cProfile of the load alone (the functions with the most own time).

    python tools/profile/ttfo_probe.py KEY --cache file:///W/cache --inputs W/inputs.pt [--rounds 3]

``W`` is a ``tools/bench/load.py --workdir``.  Prints a table of medians, then the per-call and load profiles.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run by path: the repository root in place of this folder (tools/__init__.py)
    sys.path[0] = str(REPO)

from tools._common import ChildFailed, child_flag, run_child, self_command, sync  # noqa: E402 - after the path

SCENARIOS = ("plain", "prime", "early", "serial")


def _child(a: argparse.Namespace) -> dict:
    import torch

    import precompile
    from precompile.inductor.load import prime
    from precompile.store.cache_io import load_from_cache

    inputs = torch.load(a.inputs, weights_only=False)
    calls = load_from_cache(a.key, a.cache).manifest.parts["fast"].get("prime")
    sync()
    res: dict = {}
    if a.scenario == "calls":
        t = time.perf_counter()
        if torch.cuda.is_available():
            torch.cuda.current_blas_handle()
        sync()
        res["blas_handle_s"] = time.perf_counter() - t
        rows = []
        for fn, args, kwargs in prime.check_calls(calls):
            xs = [prime._materialize(x) for x in args]
            kw = {k: prime._materialize(v) for k, v in kwargs.items()}
            times = []
            for _ in range(2):
                sync()
                t = time.perf_counter()
                fn(*xs, **kw)
                sync()
                times.append(time.perf_counter() - t)
            rows.append({"op": str(fn), "shapes": [x.shape for x in xs if isinstance(x, torch.Tensor)],
                         "first_s": times[0], "second_s": times[1]})
        res["calls"] = [{**r, "shapes": [list(s) for s in r["shapes"]]} for r in rows]
        return res
    if a.scenario == "profile":
        prof = cProfile.Profile()
        t = time.perf_counter()
        prof.enable()
        precompile.load(a.key, cache=a.cache)
        prof.disable()
        res["load_s"] = time.perf_counter() - t
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(16)
        res["profile"] = out.getvalue()
        return res
    os.environ["PRECOMPILE_PRIME"] = "all" if a.scenario == "prime" else "off"
    t0 = time.perf_counter()
    primer = None
    if a.scenario in ("early", "serial"):
        primer = prime.start(calls, on_cpu=True)
        if a.scenario == "serial":
            primer.wait()
            res["prime_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    art = precompile.load(a.key, cache=a.cache)
    t2 = time.perf_counter()
    if primer is not None:
        primer.wait()
    with torch.no_grad():
        art(*inputs)
        sync()
        t3 = time.perf_counter()
        art(*inputs)
        sync()
        t4 = time.perf_counter()
    primer = primer or art.primer
    res.update(engine=art.engine_kind, load_s=t2 - t1, first_s=t3 - t2, second_s=t4 - t3, ttfo_s=t3 - t0,
               primed=primer.done if primer else None, primer_s=primer.seconds if primer else None)
    return res


def _run(a: argparse.Namespace, scenario: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cmd = self_command(__file__, a.key, "--cache", a.cache, "--inputs", a.inputs, "--scenario", scenario)
    try:
        return run_child(cmd, scenario, env=env, timeout=300)
    except ChildFailed as err:
        raise SystemExit(f"{err}:\n{err.stderr[-3000:]}") from None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("key")
    p.add_argument("--cache", required=True)
    p.add_argument("--inputs", required=True)
    p.add_argument("--rounds", type=int, default=3)
    child_flag(p, "--scenario")
    a = p.parse_args()
    if a.scenario:
        print(json.dumps(_child(a)))
        return
    for s in SCENARIOS:  # one untimed round: bytecode written, files in the page cache
        _run(a, s)
    got: dict[str, list[dict]] = {s: [] for s in SCENARIOS}
    for _ in range(a.rounds):
        for s in SCENARIOS:
            got[s].append(_run(a, s))
    print("| scenario | load s | first call s | second call s | time to first output s | replay s | primed |")
    print("|---|---|---|---|---|---|---|")
    for s in SCENARIOS:
        def med(f: str) -> str:
            vals = [r[f] for r in got[s] if r.get(f) is not None]
            return f"{statistics.median(vals):.3f}" if vals else "-"
        print(f"| {s} | {med('load_s')} | {med('first_s')} | {med('second_s')} | {med('ttfo_s')} | "
              f"{med('primer_s')} | {got[s][-1].get('primed')} |")
    calls = _run(a, "calls")
    print(f"\ncuBLAS handle + workspace: {calls['blas_handle_s']:.3f} s; each recorded library call, fresh process:")
    for c in calls["calls"]:
        print(f"  {c['op']:<48} {c['shapes']}  first {c['first_s']:.4f} s  second {c['second_s']:.4f} s")
    prof = _run(a, "profile")
    print(f"\nload alone under cProfile: {prof['load_s']:.3f} s\n{prof['profile']}")


if __name__ == "__main__":
    main()
