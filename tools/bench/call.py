#!/usr/bin/env python
"""Steady cost of one call: precompile's loaded artifact against torch's loaded ``CompiledArtifact`` and the fresh
compile, side by side in one process.

    python tools/bench/call.py [--device cpu|cuda] [--cases a,b] [--calls 300] [--rounds 5] [--json]

Rows: the graphs of ``tools/bench/coverage.py`` for the device, plus a 12-layer ``Linear(64, 64)`` MLP at batch 4
(25 placeholders: where per-input cost shows), static and with a dynamic batch.  Per row, a build process captures
the graph with Dynamo (``no_grad``), compiles it with ``torch._inductor.standalone_compile`` and saves torch's
artifact, and compiles it with ``precompile.standalone_compile`` into a fresh cache.  A second fresh process then
loads both (``precompile.load``; ``torch._inductor.CompiledArtifact.load``), compiles the graph again in-process
(``standalone_compile`` over the warm Inductor cache: "fresh"), checks the three give bit-equal outputs, and times
them in turns: ``--rounds`` rounds, each timing ``--calls`` back-to-back calls of each callable on the same inputs
(the order rotating between rounds; on CUDA one synchronize per batch of calls).  The best round per callable is
reported, in microseconds per call, and ratio = ours / torch's (ours / the fresh compile's where torch's loaded
artifact cannot run the graph; the row says why).  The last line is JSON: ``{"worst_ratio": max over
rows of ours / torch's, "rows": {...}}``.  Goal (issue 18): every ratio <= 1.03.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run by path: the repository root in place of this folder (tools/__init__.py)
    sys.path[0] = str(REPO)

from tools._common import ChildFailed, child_flag, run_child, self_command, sync  # noqa: E402 - after the path

EXTRA = ("mlp12_static", "mlp12_dynamic")


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--cases", default=None, help="comma-separated subset (default: all for the device)")
    p.add_argument("--calls", type=int, default=300, help="calls per timed batch (default 300)")
    p.add_argument("--rounds", type=int, default=5, help="timed batches per callable (default 5; best reported)")
    p.add_argument("--json", action="store_true", help="print only the JSON line on stdout (table to stderr)")
    p.add_argument("--workdir", default=None, help="keep artifacts here (default: a temp dir)")
    child_flag(p, "--phase")
    child_flag(p, "--case")
    return p.parse_args(argv)


def phase_build(a: argparse.Namespace, work: Path) -> dict:
    import torch
    from torch._inductor.utils import fresh_cache

    import precompile
    from tools.cases.graphs import build_case

    case = build_case(a.case, a.device)
    gm, example = case.capture()
    with torch.no_grad():
        with fresh_cache():
            tart = torch._inductor.standalone_compile(gm, example, dynamic_shapes=case.mode,
                                                      options={"config_patches": case.options})
            tart.save(path=str(work / "torch.bin"), format="binary")
        art = precompile.standalone_compile(gm, example, dynamic_shapes=case.mode, options=case.options,
                                            cache="file://" + str(work / "cache"))
    concrete = [int(v.node.hint) if isinstance(v, torch.SymInt) else v for v in example]
    torch.save({"inputs": concrete}, work / "inputs.pt")
    return {"key": art.key}


def phase_measure(a: argparse.Namespace, work: Path, key: str) -> dict:
    import torch

    import precompile
    from tools.cases.graphs import build_case

    case = build_case(a.case, a.device)
    gm, example = case.capture()
    inputs = torch.load(work / "inputs.pt", weights_only=False)["inputs"]
    with torch.no_grad():
        fns = {"ours": precompile.load(key, cache="file://" + str(work / "cache")),
               "torch": torch._inductor.CompiledArtifact.load(path=str(work / "torch.bin"), format="binary"),
               "fresh": torch._inductor.standalone_compile(gm, example, dynamic_shapes=case.mode,
                                                           options={"config_patches": case.options})}
        outs, failed = {}, {}
        for name, fn in list(fns.items()):
            args = [v.clone() if isinstance(v, torch.Tensor) else v for v in inputs]
            try:
                o = fn(*args)
            except Exception as err:  # noqa: BLE001 - a path that cannot run this graph is reported, not timed
                failed[name] = f"{type(err).__name__}: {str(err)[:120]}"
                del fns[name]
                continue
            outs[name] = list(o) if isinstance(o, (list, tuple)) else [o]
        ref = outs.get("fresh") or outs.get("torch")  # torch's own paths may both fail (then nothing to compare)
        equal = None if ref is None or len(outs) < 2 else all(
            len(o) == len(ref) and all(torch.equal(x, y) for x, y in zip(o, ref)) for o in outs.values())
        args = [v.clone() if isinstance(v, torch.Tensor) else v for v in inputs]
        best = {n: float("inf") for n in fns}
        order = list(fns)
        while len(order) < 3:
            order.append(order[-1])
        for fn in fns.values():  # warm-up
            for _ in range(10):
                fn(*args)
        for r in range(a.rounds):
            for n in order[r % 3:] + order[:r % 3]:
                fn = fns[n]
                sync(a.device)
                t = time.perf_counter()
                for _ in range(a.calls):
                    fn(*args)
                sync(a.device)
                best[n] = min(best[n], (time.perf_counter() - t) / a.calls)
    us = {n: round(best[n] * 1e6, 2) if n in best else None for n in ("ours", "torch", "fresh")}
    return {"us": us, "equal": equal, "failed": failed,
            "engine": getattr(fns["ours"], "engine_kind", None) if "ours" in fns else None}


def _child(a: argparse.Namespace, work: Path, case: str, phase: str, key: str = "") -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(work / "inductor"),
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    cmd = self_command(__file__, "--phase", phase, "--case", case, "--device", a.device, "--workdir", str(work),
                       "--calls", str(a.calls), "--rounds", str(a.rounds), *(["--cases", key] if key else []))
    try:
        return run_child(cmd, f"{case} {phase}", env=env, timeout=1800)
    except ChildFailed as err:
        raise RuntimeError(f"{err}:\n{err.stdout[-3000:]}\n{err.stderr[-5000:]}") from None


def main(argv=None) -> int:
    a = _args(argv)
    if a.phase:
        work = Path(a.workdir)
        out = phase_build(a, work) if a.phase == "build" else phase_measure(a, work, a.cases)
        print(json.dumps(out))
        return 0
    from tools.cases.graphs import CPU_CASES, GPU_CASES  # (imports torch)

    cases = a.cases.split(",") if a.cases else list(CPU_CASES) + list(EXTRA) + (
        list(GPU_CASES) if a.device.startswith("cuda") else [])
    show = sys.stderr if a.json else sys.stdout
    rows = {}
    with tempfile.TemporaryDirectory(prefix="bench-call-") as tmp:
        root = Path(a.workdir or tmp)
        for i, case in enumerate(cases, 1):
            work = root / case
            work.mkdir(parents=True, exist_ok=True)
            print(f"[{i}/{len(cases)}] {case}: build", file=sys.stderr, flush=True)
            try:
                key = _child(a, work, case, "build")["key"]
                print(f"[{i}/{len(cases)}] {case}: measure", file=sys.stderr, flush=True)
                m = _child(a, work, case, "measure", key)
            except RuntimeError as err:
                print(f"  {case}: {err}", file=sys.stderr, flush=True)
                rows[case] = {"us": {"ours": None, "torch": None, "fresh": None}, "equal": None, "ratio": None,
                              "engine": None, "failed": {"row": str(err).splitlines()[0]}}
                continue
            ours, theirs = m["us"]["ours"], m["us"]["torch"] or m["us"]["fresh"]  # torch's load may fail: fresh
            m["ratio"] = round(ours / theirs, 3) if ours and theirs else None
            rows[case] = m
            print(f"  {case}: ours {m['us']['ours']} us, torch {m['us']['torch']} us, fresh {m['us']['fresh']} us, "
                  f"ratio {m['ratio']}, equal {m['equal']}, failed {m['failed'] or '-'}", file=sys.stderr, flush=True)
    head = f"{'graph':20} {'ours us':>10} {'torch us':>10} {'fresh us':>10} {'ours/torch':>10} {'engine':>9} {'equal':>6}"
    print(head, file=show)
    def num(v, fmt="{:>10.1f}"):
        return f"{'-':>10}" if v is None else fmt.format(v)

    for case, m in rows.items():
        note = "  " + "; ".join(f"{k} fails: {v}" for k, v in m["failed"].items()) if m["failed"] else ""
        print(f"{case:20} {num(m['us']['ours'])} {num(m['us']['torch'])} {num(m['us']['fresh'])} "
              f"{num(m['ratio'], '{:>10.3f}')} {str(m['engine']):>9} {str(m['equal']):>6}{note}", file=show)
    ratios = [m["ratio"] for m in rows.values() if m["ratio"] is not None]
    print(json.dumps({"worst_ratio": max(ratios) if ratios else None,
                      "equal": all(m["equal"] is not False for m in rows.values()),
                      "rows": {c: {"ratio": m["ratio"], **m["us"]} for c, m in rows.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
