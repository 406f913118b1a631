#!/usr/bin/env python
"""Where a first call after a fresh-process ``precompile.load`` goes: cProfile of the first call (``import torch``
and reading the inputs excluded), with the load, the library set-up beside it (``PRECOMPILE_PRIME``, see
``precompile.inductor.load.prime``) and the second call timed (each synced).

    python tools/profile/first_call.py KEY --cache URL --inputs inputs.pt [--top 15]
    PRECOMPILE_PRIME=off python tools/profile/first_call.py ...     # the same without priming

``inputs.pt`` holds the graph's flat inputs (``tools/bench/load.py --workdir W`` leaves ``W/inputs.pt``).  The
last line printed is a JSON object of the timings.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run by path: the repository root in place of this folder (tools/__init__.py)
    sys.path[0] = str(REPO)

from tools._common import sync  # noqa: E402 - after the repository root is on the path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("key")
    p.add_argument("--cache", required=True)
    p.add_argument("--inputs", required=True)
    p.add_argument("--top", type=int, default=15)
    a = p.parse_args()
    inputs = torch.load(a.inputs, weights_only=False)
    sync()
    t0 = time.perf_counter()
    import precompile

    art = precompile.load(a.key, cache=a.cache)
    t1 = time.perf_counter()
    prof = cProfile.Profile()
    with torch.no_grad():
        prof.enable()
        art(*inputs)
        sync()
        prof.disable()
        t2 = time.perf_counter()
        art(*inputs)
        sync()
        t3 = time.perf_counter()
    primer = art.primer
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(a.top)
    print(out.getvalue())
    print(json.dumps({"engine": art.engine_kind, "load_s": t1 - t0, "first_call_s": t2 - t1,
                      "second_call_s": t3 - t2, "primed": primer.done if primer else None,
                      "prime_s": primer.seconds if primer else None}))


if __name__ == "__main__":
    main()
