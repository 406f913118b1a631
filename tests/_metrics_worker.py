"""A serving worker for tests/test_monitoring.py: a real process whose lookups a real Prometheus scrapes.

Usage: PRECOMPILE_METRICS_PORT=PORT python tests/_metrics_worker.py

Builds a one-matmul ``make_fx`` graph (``x @ w``: Inductor emits no C++ kernel for it, so a build takes a fraction
of a second once the process is warm), then reads commands from stdin, one a line, until EOF:

    CACHE_URL EXTRA

runs ``precompile.standalone_compile(gm, inputs, cache=CACHE_URL, key_extra=...)`` (``EXTRA`` ``-``: the plain
graph's key; any other word: ``{"n": EXTRA}``, another key) and the artifact, and answers one JSON line:
``{"outcome": ..., "key": ..., "same": <the artifact's output equals eager's>}``.  Its metrics are served on the
port ``PRECOMPILE_METRICS_PORT`` names, from the first lookup on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def graph():
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    x, w = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)), torch.randn(8, 8)
    return make_fx(lambda x, w: torch.mm(x, w))(x, w), [x, w]


def main() -> int:
    import torch

    import precompile

    gm, inputs = graph()
    want = gm(*inputs)
    for line in sys.stdin:
        url, extra = line.split()
        art = precompile.standalone_compile(gm, inputs, cache=url,
                                            key_extra=None if extra == "-" else {"n": extra})
        got = art(*inputs)
        got = got[0] if isinstance(got, (list, tuple)) else got
        print(json.dumps({"outcome": art.outcome, "key": art.key, "same": bool(torch.allclose(got, want, rtol=1e-5, atol=1e-6))}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
