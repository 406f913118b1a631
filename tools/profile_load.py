#!/usr/bin/env python
"""Profile one fresh-process ``precompile.load`` (cProfile; ``import torch`` excluded) and print the top entries.

    python tools/profile_load.py KEY --cache URL [--top 40]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch  # noqa: F401 - excluded from the profile, as from the load benchmark


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("key")
    p.add_argument("--cache", required=True)
    p.add_argument("--top", type=int, default=40)
    a = p.parse_args()
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    import precompile

    art = precompile.load(a.key, cache=a.cache)
    prof.disable()
    print(f"load {time.perf_counter() - t:.3f} s, engine {art.engine_kind}")
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(a.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
