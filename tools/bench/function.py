"""Whole-function loads: a fresh process loads and calls a compiled function from a warm cache, three ways.

    python tools/bench/function.py [--device cpu|cuda] [--repeat 3] [--json] [--dynamo-imported]

For each case (a 12-layer MLP module; a transformers Llama with random weights and a dynamic sequence length; a
function with a graph break), in the same run:

- **ours**: ``precompile.compile(fn, cache=...)`` in a fresh process over a warm cache; load = the first call's
  lookup and install (``CompiledFunction.load_seconds``), first call = the rest of that call;
- **torch aot**: ``torch.compile(fn, fullgraph=True).aot_compile(...)`` saved with ``save_compiled_function``, then
  in a fresh process ``torch.compiler.load_compiled_function`` (load) and a call (first call).  It takes no graph
  breaks, so that case has no row;
- **torch.compile warm**: ``torch.compile(fn)`` in a fresh process whose Inductor caches were warmed by an earlier
  process: load = 0, first call = Dynamo's trace plus Inductor's cache hits plus the call.

Ours and torch aot load with an empty Inductor cache directory, as on a new machine that has only the cache or the
saved file.  Each load runs in ``--repeat`` fresh processes (the median is printed) with ``PYTHONDONTWRITEBYTECODE`` unset and
the bytecode warmed first (a deployed image has bytecode; without it every process compiles torch's Python).  Load
times include importing ``torch._dynamo`` where the path needs it (both torch paths and ours do).  "frames" is
Dynamo's count of traced frames in the loading process; "equal" is whether the output is bit-equal to the build's
own fresh compile of the same function.  ``--dynamo-imported`` imports ``torch._dynamo`` in every loading process
before the clock starts, as it is in a process that uses ``transformers`` or vLLM (both import it themselves):
what a load costs there.  The last line is JSON: ``{"speedup": min over cases of torch aot load s
/ ours, "frames_traced": max frames in our warm processes, "equal": all of ours bit-equal}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run by path: the repository root in place of this folder (tools/__init__.py)
    sys.path[0] = str(REPO)

from tools._common import ChildFailed, run_child  # noqa: E402 - after the repository root is on the path

# Runs in every process: builds the case's function and inputs (deterministic) as ``fn, args, kwargs, dyn``.
CASES = r'''
import torch
torch.manual_seed(0)
DEVICE = "@DEVICE@"

class MLP(torch.nn.Module):
    def __init__(self, n=12, d=64):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(n))
    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x

def with_break(x, y):
    a = torch.sin(x) @ y
    torch._dynamo.graph_break()
    return torch.softmax(a, dim=-1) + torch.cos(y).sum()

def make(case):
    if case == "mlp12":
        m = MLP().to(DEVICE).eval()
        return m, m.forward, (torch.randn(4, 64, device=DEVICE),), None
    if case == "llama":
        from precompile.recipes.catalog import get_recipe
        m = get_recipe("llama", device=DEVICE).model().eval()
        ids = torch.randint(0, 1024, (1, 24), device=DEVICE)
        return m, m.forward, (ids,), True
    if case == "break":
        return None, with_break, (torch.randn(32, 32, device=DEVICE), torch.randn(32, 32, device=DEVICE)), None
    raise SystemExit(f"unknown case {case}")
'''

BUILD = r'''
import json, sys, time
from pathlib import Path
case, mode, cache, work = sys.argv[1:5]
import torch, precompile
with torch.no_grad():
    model, fn, args, dyn = make(case)
    if mode == "ours":
        out = precompile.compile(fn, cache=cache, dynamic=dyn)(*args)
        torch.save(out.cpu(), Path(work) / f"{case}.ref.pt")
    elif mode == "aot":
        torch._dynamo.config.enable_aot_compile = True  # torch 2.11 attaches .aot_compile only then
        try:
            # as torch documents it for a module: the unbound forward, the module as its first argument
            target, targs = (type(model).forward, (model, *args)) if model is not None else (fn, args)
            try:
                compiled = torch.compile(target, fullgraph=True, dynamic=dyn).aot_compile((targs, {}))
            except torch._dynamo.exc.TensorifyScalarRestartAnalysis:
                # aot_compile cannot restart to specialize a float (a Llama's eps under dynamic=True): the
                # workaround a user would reach for, floats specialized while tracing
                torch._dynamo.reset()
                with torch._dynamo.config.patch(specialize_float=True):
                    compiled = torch.compile(target, fullgraph=True, dynamic=dyn).aot_compile((targs, {}))
            compiled.save_compiled_function(str(Path(work) / f"{case}.aot"))
        except Exception as err:
            print(json.dumps({"error": f"{type(err).__name__}: {str(err)[:200]}"}))
            raise SystemExit(0)
    else:
        torch.compile(fn, dynamic=dyn)(*args)
print(json.dumps({"ok": True}))
'''

LOAD = r'''
import json, os, sys, time
from pathlib import Path
case, mode, cache, work = sys.argv[1:5]
import torch
if os.environ.get("BENCH_DYNAMO_IMPORTED") == "1":
    import torch._dynamo  # noqa: F401 - as transformers and vLLM do before any compile
with torch.no_grad():
    model, fn, args, dyn = make(case)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    if mode == "ours":
        import precompile
        f = precompile.compile(fn, cache=cache, dynamic=dyn)
        out = f(*args)
        load = f.load_seconds
    elif mode == "aot":
        f = torch.compiler.load_compiled_function(open(Path(work) / f"{case}.aot", "rb"))
        t1 = time.perf_counter()
        load = t1 - t0
        out = f(model, *args) if model is not None else f(*args)
    else:
        out = torch.compile(fn, dynamic=dyn)(*args)
        load = 0.0
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    total = time.perf_counter() - t0
from torch._dynamo.utils import counters
ref = torch.load(Path(work) / f"{case}.ref.pt")
print(json.dumps({"load": load, "first_call": total - load, "frames": int(counters["frames"]["total"]),
                  "equal": bool(torch.equal(out.cpu(), ref)),
                  "inductor": "torch._inductor.compile_fx" in sys.modules}))
'''


def run(code: str, *args: str, env: dict[str, str]) -> dict:
    try:
        return run_child([sys.executable, "-c", code, *args], str(args), env=env, timeout=900)
    except ChildFailed as err:
        raise SystemExit(f"{err}:\n{err.stderr[-3000:]}") from None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cases", default="mlp12,llama,break")
    p.add_argument("--json", action="store_true", help="print the table's rows as JSON too")
    p.add_argument("--dynamo-imported", action="store_true",
                   help="import torch._dynamo before the clock in every loading process (as transformers and vLLM do)")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_function-"))
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PRECOMPILE_CACHE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["XDG_CACHE_HOME"] = str(work / "xdg")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor")
    env["TRITON_CACHE_DIR"] = str(work / "triton")
    env["BENCH_DYNAMO_IMPORTED"] = "1" if a.dynamo_imported else "0"
    cache = f"file://{work / 'cache'}"
    prelude = CASES.replace("@DEVICE@", a.device)
    build, load = prelude + BUILD, prelude + LOAD
    rows = []
    for case in a.cases.split(","):
        print(f"[{case}] building: ours, torch aot_compile, torch.compile (warms Inductor's caches)", flush=True)
        run(build, case, "ours", cache, str(work), env=env)
        aot_error = run(build, case, "aot", cache, str(work), env=env).get("error")
        run(build, case, "warm", cache, str(work), env=env)
        for mode in ("ours", "aot", "warm"):
            if mode == "aot" and aot_error:
                rows.append({"case": case, "path": "torch aot", "load": None, "first_call": None, "frames": None,
                             "equal": None, "note": f"aot_compile failed: {aot_error[:90]}"})
                continue
            # ours and torch aot load as a new machine would: only the cache / the saved file is carried, Inductor's
            # cache directory is empty; torch.compile warm keeps the Inductor caches its build warmed
            fresh = dict(env) if mode == "warm" else {**env, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(dir=work)}
            run(load, case, mode, cache, str(work), env=fresh)  # writes the bytecode this path imports
            got = [run(load, case, mode, cache, str(work), env=fresh if mode == "warm" else
                       {**env, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(dir=work)}) for _ in range(a.repeat)]
            rows.append({"case": case, "path": {"ours": "ours", "aot": "torch aot", "warm": "torch.compile warm"}[mode],
                         "load": statistics.median(g["load"] for g in got),
                         "first_call": statistics.median(g["first_call"] for g in got),
                         "frames": max(g["frames"] for g in got), "equal": all(g["equal"] for g in got),
                         "inductor": any(g["inductor"] for g in got)})
            print(f"  {case:6s} {rows[-1]['path']:18s} load {rows[-1]['load']:.3f} s  first call "
                  f"{rows[-1]['first_call']:.3f} s  frames {rows[-1]['frames']}", flush=True)
    print()
    print(f"{'case':8s} {'path':20s} {'load s':>8s} {'first call s':>13s} {'frames':>7s} {'equal':>6s} {'inductor':>9s}")
    for r in rows:
        if r["load"] is None:
            print(f"{r['case']:8s} {r['path']:20s} {'-':>8s} {'-':>13s} {'-':>7s} {'-':>6s} {'-':>9s}  {r['note']}")
            continue
        print(f"{r['case']:8s} {r['path']:20s} {r['load']:8.3f} {r['first_call']:13.3f} {r['frames']:7d} "
              f"{str(r['equal']):>6s} {str(r['inductor']):>9s}")
    ours = {r["case"]: r for r in rows if r["path"] == "ours"}
    ratios = {r["case"]: r["load"] / ours[r["case"]]["load"] for r in rows if r["path"] == "torch aot" and r["load"]}
    print("torch aot load / ours: " + ", ".join(f"{c} {v:.1f}x" for c, v in ratios.items()))
    if a.json:
        print(json.dumps({"rows": rows}))
    result = {"speedup": round(min(ratios.values()), 2) if ratios else None,
              "frames_traced": max(r["frames"] for r in ours.values()), "equal": all(r["equal"] for r in ours.values())}
    if a.dynamo_imported:
        result["dynamo_imported"] = True
    print(json.dumps(result))


if __name__ == "__main__":
    main()
