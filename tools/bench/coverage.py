#!/usr/bin/env python
"""Fast-path coverage: the graphs servers really compile, each loaded by torch and by precompile in fresh processes.

One row per graph: the engine precompile's load took (``fast`` is the goal), fresh-process load seconds for
torch's ``CompiledArtifact.load`` and for ``precompile.load``, their ratio, the first call after each load, eager's
first call in a fresh process of the same kind, time to first output (load + first call) and whether the outputs
(and, for graphs that write to their inputs, the written buffers) equal the fresh compile's bit for bit, at the
example size and, for symbolic graphs, at a second size.

Method, per graph: a build process captures the graph with Dynamo (a capturing backend, under ``no_grad``, sizes
marked dynamic where the case says so), compiles it with ``torch._inductor.standalone_compile`` (fresh Inductor
cache) and saves torch's artifact, compiles it with ``precompile.standalone_compile`` into a fresh local cache,
and records the fresh compile's outputs on copies of the inputs.  Then each loader runs in its own fresh process
with empty Inductor and Triton cache dirs; ``import torch`` and reading the inputs are excluded, everything after
is timed.  ``PYTHONDONTWRITEBYTECODE`` is unset for every process (``PYTHONPYCACHEPREFIX`` points into the work
dir), and one untimed round of both loads runs first, so torch's and precompile's Python is byte-compiled before
anything is timed, as in a deployed image.

    python tools/bench/coverage.py                       # CPU rows
    python tools/bench/coverage.py --device cuda         # CPU-kind rows on the GPU, plus triton_op, multi-kernel,
                                                         # max_autotune
    python tools/bench/coverage.py --device cuda --no-host-code   # rows with a wrapper graph load through it

The "wrapper" column says which wrapper each artifact carries: ``graph`` (the wrapper stored as data, no host code:
a static CUDA graph Inductor's FX wrapper expresses) or ``python`` (with the build's reason).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run by path: the repository root in place of this folder (tools/__init__.py)
    sys.path[0] = str(REPO)

from tools._common import ChildFailed, answer, child_flag, self_command, sync  # noqa: E402 - after the path


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--cases", default=None, help="comma-separated subset (default: all for the device)")
    p.add_argument("--calls", type=int, default=20, help="steady calls timed (median reported)")
    p.add_argument("--json-out", default=None, help="also write the rows as JSON to this file")
    p.add_argument("--workdir", default=None, help="keep artifacts here (default: a temp dir)")
    p.add_argument("--no-host-code", action="store_true",
                   help="load the rows whose artifact carries a wrapper graph with PRECOMPILE_REQUIRE_NO_HOST_CODE=1 "
                        "(the graph engine: no host code); the others as usual")
    p.add_argument("--profile", action="store_true",
                   help="print a cProfile of each precompile load and its first call to stderr")
    child_flag(p, "--phase")
    child_flag(p, "--case")
    return p.parse_args(argv)


def _clone(values):
    import torch

    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def _written(before, after) -> list:
    """The tensors a call wrote to (for the comparison), by position."""
    import torch

    return [a for b, a in zip(before, after) if isinstance(a, torch.Tensor) and not torch.equal(a, b)]


def _run(fn, inputs, device: str, copy: bool = True):
    """Call ``fn`` on copies of ``inputs`` (on ``inputs`` themselves when not ``copy``): ``(outputs, inputs after
    the call)``."""
    import torch

    args = _clone(inputs) if copy else list(inputs)
    with torch.no_grad():
        out = fn(*args)
    sync(device)
    return list(out) if isinstance(out, (list, tuple)) else [out], args


# ------------------------------------------------------------------------------------------------ phases
def phase_build_torch(a: argparse.Namespace, work: Path) -> dict:
    """torch's cold compile and its artifact (its own process: a compile must not see another's ShapeEnv)."""
    import torch
    from torch._inductor.utils import fresh_cache

    from tools.cases.graphs import build_case

    case = build_case(a.case, a.device)
    gm, example = case.capture()
    with fresh_cache():
        t = time.perf_counter()
        with torch.no_grad():
            tart = torch._inductor.standalone_compile(gm, example, dynamic_shapes=case.mode,
                                                      options={"config_patches": case.options})
        seconds = time.perf_counter() - t
        tart.save(path=str(work / "torch.bin"), format="binary")
    return {"torch_compile_s": seconds}


def phase_build(a: argparse.Namespace, work: Path) -> dict:
    """precompile's cold compile into a fresh cache, and the fresh compile's outputs (and written buffers) on
    copies of the inputs at the example size and, for a symbolic graph, at another size."""
    import torch

    import precompile
    from tools.cases.graphs import build_case

    case = build_case(a.case, a.device)
    gm, example = case.capture()
    # a SymInt's example value without int(), which would specialize the graph's symbol
    concrete = [int(v.node.hint) if isinstance(v, torch.SymInt) else v for v in example]
    url = "file://" + str(work / "cache")
    t = time.perf_counter()
    with torch.no_grad():
        art = precompile.standalone_compile(gm, example, dynamic_shapes=case.mode, options=case.options, cache=url)
    compile_s = time.perf_counter() - t
    symbolic = art.manifest.factors["dynamic_shapes"] == "symbolic"
    sets = {"example": concrete}
    if case.other_size is not None and symbolic:
        sets["other"] = case.at_size(gm, concrete, case.other_size)
    refs = {}
    for name, inputs in sets.items():
        out, after = _run(art, inputs, a.device)  # the fresh compile (art's engine is Inductor's callable)
        refs[name] = {"out": out, "written": _written(inputs, after)}
    torch.save({"sets": sets, "refs": refs}, work / "io.pt")
    return {"key": art.key, "cache": url, "fast_off": art.manifest.build.get("fast_off"), "compile_s": compile_s,
            "kernels": len(art.manifest.kernels), "symbolic": symbolic,
            "wrapper_graph": bool(art.manifest.parts.get("wrapper_graph")),
            "host_code": art.manifest.build.get("host_code")}


def phase_load(a: argparse.Namespace, work: Path, which: str, key: str, url: str) -> dict:
    import torch  # excluded from the load time

    io = torch.load(work / "io.pt", weights_only=False)
    sets, refs = io["sets"], io["refs"]
    first_args = _clone(sets["example"])  # copied before the clock starts: eager's first call copies nothing
    sync(a.device)
    before = set(sys.modules)
    profile = None
    if a.profile and which == "ours":
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    t0 = time.perf_counter()
    if which == "torch":
        fn = torch._inductor.CompiledArtifact.load(path=str(work / "torch.bin"), format="binary")
    else:
        import precompile

        fn = precompile.load(key, cache=url)
    t1 = time.perf_counter()
    if profile is not None:
        import io as io_module
        import pstats

        profile.disable()
        text = io_module.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(12)
        sys.stderr.write(f"--- profile of precompile.load, {a.case}\n{text.getvalue()}\n")
    imported = sorted({m.split(".")[0] if not m.startswith("torch.") else ".".join(m.split(".")[:2])
                       for m in set(sys.modules) - before if m.startswith(("torch._", "triton", "sympy"))})
    if profile is not None:
        profile = cProfile.Profile()
        profile.enable()
    t_first = time.perf_counter()  # the load's end (t1) to here: bookkeeping of this tool, not timed
    out, after = _run(fn, first_args, a.device, copy=False)
    t2 = time.perf_counter()
    if profile is not None:
        profile.disable()
        text = io_module.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
        sys.stderr.write(f"--- profile of the first call, {a.case} ({t2 - t_first:.4f} s)\n{text.getvalue()}\n")
    equal = {}
    for name, inputs in sets.items():
        o, aft = (out, after) if name == "example" else _run(fn, inputs, a.device)
        same = len(o) == len(refs[name]["out"]) and all(torch.equal(x, y) for x, y in zip(o, refs[name]["out"]))
        written = _written(inputs, aft)
        same = same and len(written) == len(refs[name]["written"]) and all(
            torch.equal(x, y) for x, y in zip(written, refs[name]["written"]))
        equal[name] = bool(same)
    args = _clone(sets["example"])
    with torch.no_grad():
        for _ in range(3):
            fn(*args)
        times = []
        for _ in range(a.calls):
            sync(a.device)
            t = time.perf_counter()
            fn(*args)
            sync(a.device)
            times.append(time.perf_counter() - t)
    return {"load_s": t1 - t0, "first_call_s": t2 - t_first, "steady_ms": statistics.median(times) * 1e3,
            "engine": getattr(fn, "engine_kind", "torch"), "equal": equal, "imported_by_load": imported}


def phase_eager(a: argparse.Namespace, work: Path) -> dict:
    import torch

    from tools.cases.graphs import build_case

    case = build_case(a.case, a.device)
    model, inputs = case.model, _clone(case.inputs)
    t = time.perf_counter()
    with torch.no_grad():
        model(*inputs)
    sync(a.device)
    return {"first_call_s": time.perf_counter() - t}


# ---------------------------------------------------------------------------------------------- children
def _env(work: Path, name: str) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as in a deployed image: byte-compiled once, then reused
    env["PYTHONPYCACHEPREFIX"] = str(work.parent / "pycache")
    d = Path(tempfile.mkdtemp(prefix=f"inductor-{name}-", dir=work))
    env["TORCHINDUCTOR_CACHE_DIR"] = str(d)
    env["TRITON_CACHE_DIR"] = str(d / "triton")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def _child(a: argparse.Namespace, work: Path, case: str, phase: str, no_host_code: bool = False) -> dict:
    cmd = self_command(__file__, "--phase", phase, "--case", case, "--workdir", str(work), "--device", a.device,
                       "--calls", str(a.calls), *(["--profile"] if a.profile else []))
    env = _env(work, phase.split(",")[0])
    env.pop("PRECOMPILE_REQUIRE_NO_HOST_CODE", None)
    if no_host_code:
        env["PRECOMPILE_REQUIRE_NO_HOST_CODE"] = "1"
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if a.profile and "--- profile" in proc.stderr:
        sys.stderr.write(proc.stderr[proc.stderr.index("--- profile"):])
    try:
        return answer(f"{case}: phase {phase.split(',')[0]}", proc.returncode, proc.stdout, proc.stderr)
    except ChildFailed as err:
        sys.stderr.write(err.stderr[-4000:])
        raise


def measure(a: argparse.Namespace, root: Path, case: str, warm: bool) -> dict:
    """Build one case, then load it with torch and with precompile (twice each when ``warm``: the first, untimed
    round byte-compiles the load path), and time eager's first call.  A case torch cannot build or load is
    still measured for precompile, with torch's error in the row."""
    work = root / case
    work.mkdir(parents=True, exist_ok=True)
    b = _child(a, work, case, "build")
    torch_error = None
    try:
        b.update(_child(a, work, case, "build-torch"))
    except RuntimeError as err:
        torch_error = str(err)
    t: dict | None = None
    for _ in range(2 if warm else 1):
        if torch_error is None:
            try:
                t = _child(a, work, case, f"torch,{b['key']},{b['cache']}")
            except RuntimeError as err:
                torch_error = str(err)
        o = _child(a, work, case, f"ours,{b['key']},{b['cache']}", no_host_code=a.no_host_code and b["wrapper_graph"])
    e = _child(a, work, case, "eager")
    row = {
        "case": case, "engine": o["engine"], "fast_off": b["fast_off"], "symbolic": b["symbolic"],
        "kernels": b["kernels"], "compile_s": b["compile_s"], "torch_compile_s": b.get("torch_compile_s"),
        "load_s": o["load_s"], "first_call_s": o["first_call_s"], "eager_first_call_s": e["first_call_s"],
        "ttfo_s": o["load_s"] + o["first_call_s"], "steady_ms": o["steady_ms"], "equal": o["equal"],
        "imported_by_load": o["imported_by_load"], "torch_error": torch_error,
        "wrapper": "graph" if b["wrapper_graph"] else "python", "host_code": b["host_code"],
    }
    if t is not None:
        row.update({
            "torch_load_s": t["load_s"], "load_ratio": t["load_s"] / o["load_s"],
            "torch_first_call_s": t["first_call_s"], "torch_ttfo_s": t["load_s"] + t["first_call_s"],
            "ttfo_ratio": (t["load_s"] + t["first_call_s"]) / (o["load_s"] + o["first_call_s"]),
            "torch_steady_ms": t["steady_ms"], "torch_equal": t["equal"],
        })
    return row


def main(argv=None) -> int:
    a = _args(argv)
    if a.phase:
        work = Path(a.workdir)
        if a.phase == "build":
            result = phase_build(a, work)
        elif a.phase == "build-torch":
            result = phase_build_torch(a, work)
        elif a.phase == "eager":
            result = phase_eager(a, work)
        else:
            which, key, url = a.phase.split(",", 2)
            result = phase_load(a, work, which, key, url)
        print(json.dumps(result))
        return 0
    from tools.cases.graphs import CPU_CASES, GPU_CASES  # (imports torch)

    cases = a.cases.split(",") if a.cases else [*CPU_CASES, *(GPU_CASES if a.device.startswith("cuda") else ())]
    root = Path(a.workdir or tempfile.mkdtemp(prefix="bench-coverage-"))
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    rows = []
    with Progress(console=Console(stderr=True)) as progress:
        task = progress.add_task("coverage", total=len(cases))
        for i, case in enumerate(cases):
            progress.update(task, description=case)
            try:
                rows.append(measure(a, root, case, warm=i == 0))
            except Exception as err:  # noqa: BLE001 - one failing case is a row, not the end of the run
                rows.append({"case": case, "error": f"{type(err).__name__}: {err}"})
            progress.advance(task)
    import torch

    title = (f"fast-path coverage on {a.device} ({torch.__version__}): fresh-process loads, bytecode warm; "
             "ratios torch / precompile")
    table = Table(title=title)
    for col in ("graph", "engine", "wrapper", "load s torch", "load s ours", "ratio", "first call s torch / ours / eager",
                "load+first s torch / ours", "ratio", "equal (example, other size)"):
        table.add_column(col, justify="left" if col in ("graph", "engine", "wrapper") else "right")
    for r in rows:
        if "error" in r:
            table.add_row(r["case"], f"[red]{r['error'][:60]}", *[""] * 8)
            continue
        eq = "/".join("yes" if v else "NO" for v in r["equal"].values())
        engine = r["engine"] + ("" if r["engine"] in ("fast", "graph") else f" ({r['fast_off']})")
        wrapper = "graph (no host code)" if r["wrapper"] == "graph" else f"python ({(r['host_code'] or '')[:40]})"
        if "torch_load_s" not in r:  # torch's own artifact does not build or load: its columns are empty
            table.add_row(r["case"], engine, wrapper, "failed", f"{r['load_s']:.3f}", "-",
                          f"- / {r['first_call_s']:.4f} / {r['eager_first_call_s']:.4f}", f"- / {r['ttfo_s']:.3f}",
                          "-", eq)
            continue
        table.add_row(r["case"], engine, wrapper, f"{r['torch_load_s']:.3f}", f"{r['load_s']:.3f}",
                      f"{r['load_ratio']:.1f}x",
                      f"{r['torch_first_call_s']:.4f} / {r['first_call_s']:.4f} / {r['eager_first_call_s']:.4f}",
                      f"{r['torch_ttfo_s']:.3f} / {r['ttfo_s']:.3f}", f"{r['ttfo_ratio']:.1f}x", eq)
    con = Console(width=160)
    con.print(table)
    for r in rows:
        if r.get("imported_by_load"):
            con.print(f"{r['case']}: precompile's load imported {', '.join(r['imported_by_load'])}")
        if r.get("torch_error"):
            con.print(f"{r['case']}: torch's own artifact failed: {r['torch_error']} (its log is above, on stderr)")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all("error" not in r and r["engine"] in ("fast", "graph") and all(r["equal"].values())
                    for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
