#!/usr/bin/env python
"""The library families of issue 28 (:mod:`tools.cases.libs`), cold then warm, in fresh processes, beside torch's
own warm starts.

    python tools/bench/libs.py [--json] [--device cuda] [--cases a,b] [--config JSON] [--repeat 3] [--calls 40]
                               [--dynamo-imported]

Per case, each step a fresh process (:mod:`tools.cases.run_libs`), the model built before the clock starts:

- **cold**: ``precompile.compile`` with an empty Inductor cache directory and an empty precompile cache;
- **warm** (ours): an empty Inductor directory, the precompile cache the cold process filled, as a new worker;
- **torch warm**: ``torch.compile`` in a process whose Inductor directory an earlier ``torch.compile`` process
  filled (that earlier process also saves ``torch.compiler.save_cache_artifacts()``);
- **mega**: ``torch.compiler.load_cache_artifacts(bytes)`` first, then ``torch.compile``, with an empty Inductor
  directory: torch's Mega-Cache;
- **per call**: ours (a warm hit) and ``torch.compile``'s (over the warm Inductor directory) in one process,
  called in turns with sizes alternating from call to call (a server's mix of prefill and decode: sequence
  lengths, batch sizes or prompts, per case), each call timed alone after ``--warmup`` calls; ratio = ours'
  median / torch's median.

Figures are seconds from the compile call to the compiled callable's first return (time to first output); warm
ones are medians over ``--repeat`` processes.  Every child runs with ``PYTHONDONTWRITEBYTECODE`` unset and its
bytecode under ``PYTHONPYCACHEPREFIX`` in the work dir, which is filled first (``compileall`` of torch, the cases'
libraries and this repository, untimed), and before the timed processes of each path one untimed process of that
path runs (a deployed image has bytecode; without it every process compiles torch's Python).  ``--dynamo-imported`` imports ``torch._dynamo`` in every child before the clock, as in any process that
uses transformers or vLLM.  "frames" is what Dynamo traced in our warm processes (all their calls); "equal":
ours warm bit-equal to ours cold, and generated tokens equal to eager's.  The last line is JSON: ``{"cases": n,
"hits": n, "frames_traced": max, "equal": all, "min_speedup_vs_torch_warm": min over cases of torch warm s /
ours, "worst_call_ratio": max per-call ratio}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run by path: the repository root in place of this folder (tools/__init__.py)
    sys.path[0] = str(REPO)

from tools._common import ChildFailed, run_child  # noqa: E402 - after the repository root is on the path

log = logging.getLogger("precompile.tools.bench.libs")


class Runner:
    """Fresh child processes of :mod:`tools.cases.run_libs` for one case, each with its own Inductor directory."""

    def __init__(self, a: argparse.Namespace, work: Path, case: str) -> None:
        self.a, self.case, self.work = a, case, work / case
        self.work.mkdir(parents=True)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PRECOMPILE_CACHE")}
        env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")  # shared by every child: written once, then reused
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        env["XDG_CACHE_HOME"] = str(self.work / "xdg")
        env["BENCH_DYNAMO_IMPORTED"] = "1" if a.dynamo_imported else "0"
        self.env, self.cache, self.n = env, f"file://{self.work / 'cache'}", 0

    def inductor_dir(self, name: str | None = None) -> Path:
        """A named Inductor directory (kept warm across processes), or a new empty one."""
        if name is None:
            self.n += 1
            name = f"empty-{self.n}"
        d = self.work / f"inductor-{name}"
        d.mkdir(exist_ok=True)
        return d

    def __call__(self, mode: str, inductor: Path, *extra: str, tag: str = "run") -> dict[str, Any]:
        """Run mode ``mode``: the case's row of the child's JSON (with its ``frames``), or ``{"error": ...}``."""
        cmd = [sys.executable, "-m", "tools.cases.run_libs", mode, "--cases", self.case, "--work", str(self.work),
               "--cache", self.cache, "--device", self.a.device, "--tag", tag, *extra]
        if self.a.config:
            cmd += ["--config", self.a.config]
        env = {**self.env, "TORCHINDUCTOR_CACHE_DIR": str(inductor), "TRITON_CACHE_DIR": str(inductor / "triton")}
        started = time.perf_counter()
        try:
            rep = run_child(cmd, f"{self.case} {mode}", env=env, timeout=self.a.timeout)
        except ChildFailed as err:
            tail = err.stderr.strip().splitlines()[-1:] or ["no output"]
            log.warning("%s %s failed (exit %d): %s", self.case, mode, err.returncode, err.stderr[-3000:])
            return {"error": f"{mode}: {tail[0][:160]}"}
        row = {**rep["cases"][self.case], "frames": rep["frames"]}
        log.info("  %-18s %-8s %6.1f s in the process; %s", self.case, tag if mode == "ours" else mode,
                 time.perf_counter() - started, _brief(row))
        return row


def _brief(row: dict[str, Any]) -> str:
    keys = ("first_s", "outcome", "frames", "miss_reason", "ratio")
    return ", ".join(f"{k}={row[k]:.3f}" if isinstance(row.get(k), float) else f"{k}={row.get(k)}"
                     for k in keys if k in row)


def _timed(run: Runner, mode: str, inductor: Any, repeat: int, *extra: str) -> list[dict[str, Any]]:
    """One untimed process (bytecode), then ``repeat`` timed ones; ``inductor`` None: a new empty dir each."""
    rows = []
    for i in range(repeat + 1):
        row = run(mode, inductor or run.inductor_dir(), *extra, tag=f"warm{i}")
        if "error" in row:
            return [row]
        if i:
            rows.append(row)
    return rows


def bench_case(a: argparse.Namespace, work: Path, case: str) -> dict[str, Any]:
    """All of one case's processes: its table row."""
    import torch

    run = Runner(a, work, case)
    cold = run("ours", run.inductor_dir(), tag="cold")
    if "error" in cold:
        return {"case": case, **cold}
    ours = _timed(run, "ours", None, a.repeat)
    if "error" in ours[0]:
        return {"case": case, **ours[0]}
    torch_dir = run.inductor_dir("torch")
    torch_cold = run("torch", torch_dir, "--save-mega")
    theirs = _timed(run, "torch", torch_dir, a.repeat) if "error" not in torch_cold else [torch_cold]
    mega = _timed(run, "mega", None, a.repeat) if (run.work / f"{case}.mega").exists() else \
        [{"error": "no Mega-Cache artifacts were saved"}]
    per = run("percall", torch_dir, "--calls", str(a.calls), "--warmup", str(a.warmup))
    ref = torch.load(run.work / "ours-cold.pt")[case]
    equal = True
    for i in range(1, a.repeat + 1):
        got = torch.load(run.work / f"ours-warm{i}.pt")[case]
        equal &= set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in ref)
    equal &= all(r["eager_equal"] is not False for r in [cold, *ours])

    def med(rows: list[dict[str, Any]]) -> float | None:
        return None if "error" in rows[0] else statistics.median(r["first_s"] for r in rows)

    row = {"case": case, "cold_s": cold["first_s"], "cold_run_s": cold["run_s"], "warm_s": med(ours),
           "warm_run_s": statistics.median(r["run_s"] for r in ours), "torch_warm_s": med(theirs),
           "mega_s": med(mega), "outcomes": sorted({r["outcome"] for r in ours}),
           "miss_reason": next((r["miss_reason"] for r in ours if r["miss_reason"]), None),
           "frames": max(r["frames"] for r in ours), "torch_frames": None if "error" in theirs[0] else
           max(r["frames"] for r in theirs), "call_ratio": per.get("ratio"), "ours_call_us": per.get("ours_us"),
           "torch_call_us": per.get("torch_us"), "equal": bool(equal),
           "errors": [r["error"] for r in (theirs[0], mega[0], per) if "error" in r],
           "mega_artifacts": mega[-1].get("mega_artifacts"), "call_loop_frames": per.get("loop_frames"),
           "call_outputs_same": per.get("same_as_torch"),
           "dynamo_before_clock": all(r["dynamo_before_clock"] for r in ours)}
    row["speedup"] = row["torch_warm_s"] / row["warm_s"] if row["torch_warm_s"] else None
    return row


def _fmt(v: Any, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec) if isinstance(v, float) else str(v)


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as aligned text (seconds; ratio = ours / torch.compile's per call)."""
    head = ("case", "cold s", "warm s", "torch warm s", "mega s", "speedup", "frames", "call ratio", "equal")
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append((r["case"], "error: " + r["error"], *[""] * 7))
            continue
        hit = r["outcomes"] == ["hit"]
        lines.append((r["case"], _fmt(r["cold_s"]), _fmt(r["warm_s"], ".3f") + ("" if hit else " " + "/".join(
            r["outcomes"])), _fmt(r["torch_warm_s"]), _fmt(r["mega_s"]), _fmt(r["speedup"], ".1f") + "x",
            str(r["frames"]), _fmt(r["call_ratio"], ".3f"), str(r["equal"])))
    widths = [max(len(line[i]) for line in lines if len(line[i]) < 40) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
                     for line in lines)


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The last line: counts over all cases (a case that errored counts as no hit and not equal)."""
    ok = [r for r in rows if "error" not in r]
    speedups = [r["speedup"] for r in ok if r["speedup"] is not None]
    ratios = [r["call_ratio"] for r in ok if r["call_ratio"] is not None]
    return {"cases": len(rows), "hits": sum(r["outcomes"] == ["hit"] for r in ok),
            "frames_traced": max((r["frames"] for r in ok), default=None),
            "equal": len(ok) == len(rows) and all(r["equal"] for r in ok),
            "min_speedup_vs_torch_warm": round(min(speedups), 2) if speedups else None,
            "worst_call_ratio": round(max(ratios), 3) if ratios else None}


def main(argv: list[str] | None = None) -> None:
    from tools.cases.libs import CASES

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--cases", default=None, help=f"comma-separated subset of: {', '.join(CASES)} (default: all "
                   "whose libraries import here)")
    p.add_argument("--config", default=None,
                   help="JSON object of config keywords over each case's small default (a held-back config)")
    p.add_argument("--repeat", type=int, default=3, help="timed warm processes per path (median reported)")
    p.add_argument("--calls", type=int, default=40, help="timed calls of each callable in the per-call process")
    p.add_argument("--warmup", type=int, default=6, help="untimed calls of each callable before those")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before a child process is killed")
    p.add_argument("--json", action="store_true", help="print the rows as JSON too, before the summary line")
    p.add_argument("--workdir", default=None, help="keep the caches and outputs here (default: a temp dir)")
    p.add_argument("--dynamo-imported", action="store_true",
                   help="import torch._dynamo before the clock in every child (as transformers and vLLM do)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    names = a.cases.split(",") if a.cases else [n for n, c in CASES.items() if _importable(c.needs)]
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        p.error(f"unknown cases {unknown}")
    work = Path(a.workdir or tempfile.mkdtemp(prefix="bench-libs-"))
    print(f"# {len(names)} cases on {a.device}; children run with PYTHONDONTWRITEBYTECODE unset and bytecode warmed "
          f"first (as in a deployed image){'; torch._dynamo imported before the clock' if a.dynamo_imported else ''}"
          f"; work dir {work}", flush=True)
    warm_bytecode(work, names)
    rows = []
    for i, name in enumerate(names, 1):
        log.info("[%d/%d] %s: cold, warm x%d, torch.compile cold + warm x%d, mega-cache x%d, per call", i, len(names),
                 name, a.repeat, a.repeat, a.repeat)
        rows.append(bench_case(a, work, name))
    print(table(rows))
    already = [r["case"] for r in rows if r.get("dynamo_before_clock")]
    if already and not a.dynamo_imported:
        print(f"# torch._dynamo was imported before the clock anyway (building the model imports it) in: "
              f"{', '.join(already)}")
    if a.json:
        print(json.dumps({"rows": rows}))
    print(json.dumps(summary(rows)))


def warm_bytecode(work: Path, names: list[str]) -> None:
    """Byte-compile torch, the cases' libraries and this repository into the children's ``PYTHONPYCACHEPREFIX``
    (untimed), so that no timed process, cold or warm, pays for compiling Python that a deployed image has."""
    import importlib.util

    from tools.cases.libs import CASES

    roots = [str(REPO / d) for d in ("precompile", "cache_backends", "tools")]
    for module in ["torch", *sorted({CASES[n].needs for n in names})]:
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.submodule_search_locations:
            roots.extend(spec.submodule_search_locations)
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(work / "pycache")}
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *roots], env=env, capture_output=True)
    log.info("bytecode of %d package folders written in %.0f s (untimed)", len(roots), time.perf_counter() - started)


def _importable(module: str) -> bool:
    """Whether the case's library imports here (torchvision through :func:`tools.cases.vision.import_torchvision`)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from tools.cases.vision import import_torchvision; "
            "import_torchvision(); import timm") if module in ("torchvision", "timm") else f"import {module}"
    return subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True).returncode == 0


if __name__ == "__main__":
    main()
