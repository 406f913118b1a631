#!/usr/bin/env python
"""Where one steady call of a loaded artifact goes: precompile's artifact, its engine alone, and torch's loaded
``CompiledArtifact``, timed in one process, then a cProfile of precompile's calls.

    python tools/profile/call.py CASE [--device cpu|cuda] [--calls 2000]

CASE is a graph of ``tools/cases/graphs.py`` (e.g. ``mlp12_static``).  Builds it (torch's and precompile's
compile, fresh caches in a temporary directory), loads both, and prints microseconds per call of each (best of 5
batches of ``--calls``) and the top of a cProfile by own time.  A companion to ``tools/bench/call.py``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run by path: the repository root in place of this folder (tools/__init__.py)
    sys.path[0] = str(REPO)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("case")
    p.add_argument("--device", default="cpu")
    p.add_argument("--calls", type=int, default=2000)
    a = p.parse_args(argv)
    import torch
    from torch._inductor.utils import fresh_cache

    import precompile
    from tools._common import sync
    from tools.cases.graphs import build_case

    case = build_case(a.case, a.device)
    gm, example = case.capture()
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        with fresh_cache():
            tart = torch._inductor.standalone_compile(gm, example, dynamic_shapes=case.mode,
                                                      options={"config_patches": case.options})
            tart.save(path=f"{tmp}/t.bin", format="binary")
        url = f"file://{tmp}/cache"
        key = precompile.standalone_compile(gm, example, dynamic_shapes=case.mode, options=case.options, cache=url).key
        ours = precompile.load(key, cache=url)
        theirs = torch._inductor.CompiledArtifact.load(path=f"{tmp}/t.bin", format="binary")
        args = [int(v.node.hint) if isinstance(v, torch.SymInt) else v for v in example]
        fns = {"ours": ours, "ours' engine": ours.engine, "torch": theirs}
        for fn in fns.values():
            for _ in range(20):
                fn(*args)
        for name, fn in fns.items():
            best = float("inf")
            for _ in range(5):
                sync(a.device)
                t = time.perf_counter()
                for _ in range(a.calls):
                    fn(*args)
                sync(a.device)
                best = min(best, (time.perf_counter() - t) / a.calls)
            print(f"{name:14} {best * 1e6:9.2f} us per call")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.calls):
            ours(*args)
        sync(a.device)
        prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    return 0


if __name__ == "__main__":
    sys.exit(main())
