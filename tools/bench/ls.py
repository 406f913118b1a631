#!/usr/bin/env python
"""``precompile ls --json`` over a large cache: seconds and peak RSS of the command, in a fresh process.

The cache (``--work DIR/cache``, made once and reused) holds ``--refs`` small artifacts: one tiny graph compiled
here, its manifest stored again under ``--refs`` keys, each copy with its own key and build time (so each ref names
its own manifest blob, as in a real cache), every part shared.  Then ``python -m precompile ls --json`` runs
``--repeat`` times with stdout to a file; the tool prints one JSON line: the median wall seconds, the largest peak
RSS of the command (``ru_maxrss`` of the child), and the size and sha256 of what it printed, so two versions of
precompile (``--pythonpath``: the checkout whose ``precompile ls`` runs, default this one) can be compared on the
same cache, output included.  The cache is filled in a process of its own: a child's ``ru_maxrss`` counts what it
shared with its parent before ``exec``, so a parent grown by the filling inflated the first figures.

    python tools/bench/ls.py --refs 20000 --work /tmp/bench-ls
    python tools/bench/ls.py --refs 20000 --work /tmp/bench-ls --pythonpath /tmp/old-checkout
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run by path: the repository root in place of this folder (tools/__init__.py)
    sys.path[0] = str(REPO)

from tools._common import child_flag  # noqa: E402 - after the repository root is on the path


def _template(cache_url: str) -> dict:
    """The manifest of a tiny graph compiled into ``cache_url`` (a matmul and a ReLU, CPU)."""
    import torch

    import precompile

    def tiny(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w)

    from torch.fx.experimental.proxy_tensor import make_fx

    inputs = [torch.randn(2, 8), torch.randn(8, 8)]
    art = precompile.standalone_compile(make_fx(tiny)(*inputs), inputs, cache=cache_url)
    return json.loads(art.manifest.to_json())


def fill(root: Path, refs: int) -> None:
    """Store ``refs`` copies of a compiled manifest under their own keys in the local cache at ``root``."""
    from cache_backends.local.cache import LocalCache

    cache = LocalCache(root, max_bytes=1 << 40)
    have = sum(1 for _ in cache.iter_refs())
    if have >= refs:
        return
    doc = _template(f"file://{root}?max_bytes={1 << 40}")
    for i in range(have, refs):
        key = hashlib.sha256(f"bench-ls {i}".encode()).hexdigest()
        doc["key"], doc["build"]["created"] = key, f"2026-01-01T00:00:00.{i:06d}+00:00"
        cache.set_ref(key, cache.put_blob(json.dumps(doc, sort_keys=True, indent=1).encode()))
        if i % 2000 == 0:
            print(f"stored {i} of {refs} refs", file=sys.stderr, flush=True)


def run_ls(url: str, out: Path, pythonpath: Path) -> tuple[float, float]:
    """``(wall seconds, peak RSS in MiB)`` of one ``precompile ls --json`` of checkout ``pythonpath``, in a fresh
    process."""
    start = time.perf_counter()
    with open(out, "wb") as f:
        # run from the output's directory: ``-m`` puts the working directory first on sys.path, so from a checkout's
        # root that checkout's precompile would run whatever PYTHONPATH names
        proc = subprocess.Popen([sys.executable, "-m", "precompile", "ls", "--json", "--cache", url], stdout=f,
                                cwd=out.parent, env={**os.environ, "PYTHONPATH": str(pythonpath)})
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"precompile ls --json exited {os.waitstatus_to_exitcode(status)}")
    return seconds, usage.ru_maxrss / 1024


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--refs", type=int, default=20000)
    ap.add_argument("--work", type=Path, required=True, help="where the cache is made (and reused)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pythonpath", type=Path, default=REPO, help="the checkout whose precompile ls runs")
    child_flag(ap, "--fill-only", action="store_true", default=False)  # the filling process
    a = ap.parse_args(argv)
    root = a.work / "cache"
    if a.fill_only:
        fill(root, a.refs)
        return
    subprocess.run([sys.executable, __file__, "--fill-only", "--refs", str(a.refs), "--work", str(a.work)],
                   check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    out = a.work / "ls.json"
    runs = [run_ls(f"file://{root}", out, a.pythonpath.resolve()) for _ in range(a.repeat)]
    data = out.read_bytes()
    print(json.dumps({"refs": a.refs, "seconds": round(statistics.median(s for s, _ in runs), 2),
                      "peak_rss_mib": round(max(r for _, r in runs), 1), "output_bytes": len(data),
                      "output_sha256": hashlib.sha256(data).hexdigest(), "entries": len(json.loads(data))}))


if __name__ == "__main__":
    main()
