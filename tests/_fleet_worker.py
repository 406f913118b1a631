"""A serving worker for tests/store/test_fleet.py: a real process that gets one artifact through a shared cache.

Usage: python tests/_fleet_worker.py CACHE_URL READY_DIR GO_FILE [WIDTH]

Builds the 2-layer MLP of ``_graphs`` (hidden width ``WIDTH``, default 32: another width is another key) as a
``make_fx`` graph, touches ``READY_DIR/<pid>``, waits for ``GO_FILE`` (so that many workers call at the same
moment), then calls ``precompile.standalone_compile(..., cache=CACHE_URL)`` and runs the artifact.  Prints one
JSON line: outcome, key, Inductor compiles run in this process (Dynamo's counters), largest difference from the
eager graph, and seconds from GO to a usable artifact.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    url, ready, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    width = int(sys.argv[4]) if len(sys.argv) > 4 else 32
    import _graphs
    import torch
    from torch._dynamo.utils import counters

    import precompile
    from precompile.cli import setup_logging

    setup_logging()
    gm, inputs = _graphs.graph("make_fx", _graphs.mlp(h=width))
    with torch.no_grad():
        want = gm(*inputs)
    ready.mkdir(parents=True, exist_ok=True)
    (ready / str(os.getpid())).touch()
    deadline = time.monotonic() + 120
    while not go.exists():
        if time.monotonic() > deadline:
            print("GO file never appeared", file=sys.stderr)
            return 2
        time.sleep(0.005)
    start = time.monotonic()
    art = precompile.standalone_compile(gm, inputs, cache=url)
    got = art(*inputs)
    seconds = time.monotonic() - start
    compiles = counters["inductor"]["fxgraph_cache_miss"] + counters["aot_autograd"]["total"]
    diff = max(float((g - w).abs().max()) for g, w in zip(got, want))
    print(json.dumps({"pid": os.getpid(), "outcome": art.outcome, "key": art.key, "compiles": compiles,
                      "max_diff": diff, "seconds": round(seconds, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
