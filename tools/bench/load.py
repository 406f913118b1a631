#!/usr/bin/env python
"""Load benchmark: torch's ``CompiledArtifact.load`` vs ``precompile.load``, each in a fresh process.

In one run, for one model and shape:

1. build (one process): capture the model's graph with Dynamo; cold-compile it with
   ``torch._inductor.standalone_compile`` (empty Inductor cache dir) and save torch's artifact; compile it
   with ``precompile.standalone_compile`` into a fresh local cache.  Steady call latency of the freshly
   compiled callable is the reference (``compiled_call_ms``).
2. torch load (fresh process, empty Inductor and Triton cache dirs): ``import torch`` is excluded; everything
   after it is timed: ``CompiledArtifact.load`` + the first call, then steady calls.
3. precompile load (fresh process, empty Inductor and Triton cache dirs): the same with
   ``precompile.load(key, cache=...)``, reading the cache included.

Time to first output (what a cold serving worker waits for) is load + first call, for torch's load, ours without
priming (``PRECOMPILE_PRIME=off``) and ours with the graph's library calls replayed beside the load
(``PRECOMPILE_PRIME=all``; ``on``, GPU graphs only, is the default), each against its load + second call
and against eager's first call in a fresh process of the same kind (building the model is not timed).  Every
child runs with ``PYTHONDONTWRITEBYTECODE`` unset (bytecode under ``PYTHONPYCACHEPREFIX`` in the work dir) after
one untimed round of each load, so that torch's and precompile's Python is byte-compiled, as in a deployed
image.  Outputs of both loads are compared with the fresh compile's.  Peak extra resident memory of each load is
``ru_maxrss`` after the first call minus before the load.  Also: a warm load (``load`` + ``bind`` +
``warmup()``, its first call); N loads at once (``--concurrent N``: the processes import torch first, then start
their loads on one GO file); and the steady call of the loaded callable against the fresh compile's, called
alternately in the build process (``paired_steady_ms``), which cancels the machine's noise.  What signing
costs: the same load from a cache of signed manifests with ``PRECOMPILE_VERIFY_KEYS`` set (``signed_load_s``,
its ratio to torch's load and to the unsigned load; ``--repeat`` signed and unsigned loads alternate, medians
compared), the signature check alone (``verify_ms``, median) and the one-time import of ``cryptography``'s Ed25519
in a fresh process (``crypto_import_ms``).

    python tools/bench/load.py --model llama --shape 1x32
    python tools/bench/load.py --model tools.cases.recipes:resnet18 --shape 16x224 --device cuda --dtype bfloat16
    python tools/bench/load.py --model tools.cases.recipes:transformer_blocks --shape 4x128 --json
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

from tools._common import ChildFailed, child_flag, finish_child, self_command, start_child  # noqa: E402
from tools.bench.load_phases import phase_build, phase_build_ours, phase_eager, phase_load  # noqa: E402


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama", help="recipe: minilm, llama, ..., or module:function")
    p.add_argument("--shape", default="1x32")
    p.add_argument("--config", default=None, help="recipe config JSON")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None)
    p.add_argument("--options", default=None, help="Inductor options JSON")
    p.add_argument("--calls", type=int, default=30, help="steady calls timed (median reported)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--json-out", default=None, help="also write the JSON object to this file")
    p.add_argument("--workdir", default=None, help="keep artifacts here (default: a temp dir)")
    p.add_argument("--concurrent", type=int, default=0,
                   help="also start this many precompile loads at once and report their load seconds")
    p.add_argument("--rounds", type=int, default=3,
                   help="fresh-process precompile loads, plain and primed alternating (medians reported)")
    p.add_argument("--repeat", type=int, default=3,
                   help="signed and unsigned fresh-process loads, alternating, for the signing cost (medians)")
    child_flag(p, "--phase")
    return p.parse_args(argv)


def _start_child(a: argparse.Namespace, work: Path, phase: str, env: dict) -> subprocess.Popen:
    cmd = self_command(__file__, "--phase", phase, "--workdir", str(work), "--model", a.model, "--shape", a.shape,
                       "--device", a.device, "--calls", str(a.calls))
    for flag, v in (("--config", a.config), ("--dtype", a.dtype), ("--options", a.options)):
        if v:
            cmd += [flag, v]
    return start_child(cmd, env)


def _finish_child(proc: subprocess.Popen) -> dict:
    try:
        return finish_child(proc, f"benchmark phase {proc.args[3]}")
    except ChildFailed as err:
        sys.stderr.write(err.stderr[-4000:])
        raise SystemExit(str(err)) from None


def _child(a: argparse.Namespace, work: Path, phase: str, env: dict) -> dict:
    return _finish_child(_start_child(a, work, phase, env))


def _medians(runs: list[dict]) -> dict:
    """The first run's record with each timing replaced by the median over ``runs``."""
    out = dict(runs[0])
    for k in ("load_s", "first_call_s", "second_call_s", "steady_call_ms", "peak_extra_rss_mb"):
        out[k] = statistics.median(r[k] for r in runs)
    out["matches"] = all(r["matches"] for r in runs)
    out["matches_own"] = all(r.get("matches_own") is not False for r in runs)
    return out


def _fresh_env(work: Path, name: str, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PRECOMPILE_PRIME"}  # plain unless a phase asks
    env.update(extra)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as in a deployed image: byte-compiled once, then reused
    env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    d = Path(tempfile.mkdtemp(prefix=f"inductor-{name}-", dir=work))
    env["TORCHINDUCTOR_CACHE_DIR"] = str(d)
    env["TRITON_CACHE_DIR"] = str(d / "triton")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def main(argv=None) -> int:
    a = _args(argv)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="bench-load-"))
    work.mkdir(parents=True, exist_ok=True)
    if a.phase:
        if a.phase == "build":
            result = phase_build(a, work)
        elif a.phase == "build-ours":
            result = phase_build_ours(a, work)
        elif a.phase == "eager":
            result = phase_eager(a, work)
        elif a.phase == "crypto-import":
            t = time.perf_counter()
            from cryptography.exceptions import InvalidSignature  # noqa: F401
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey  # noqa: F401

            result = {"crypto_import_ms": (time.perf_counter() - t) * 1000}
        else:
            which, key, url = a.phase.split(",", 2)
            result = phase_load(a, work, which, key, url)
        print(json.dumps(result))
        return 0
    build = _child(a, work, "build", _fresh_env(work, "build"))
    build.update(_child(a, work, "build-ours", _fresh_env(work, "build-ours")))
    ours_phase, primed = f"ours,{build['key']},{build['cache']}", {"PRECOMPILE_PRIME": "all"}
    unprimed = {"PRECOMPILE_PRIME": "off"}
    for name in ("torch", "ours"):  # untimed: byte-compiles each load path's Python, as a deployed image has it
        _child(a, work, f"{name},{build['key']},{build['cache']}", _fresh_env(work, f"{name}-bytecode"))
    _child(a, work, f"ours,{build['key']},{build['signed_cache']}",
           _fresh_env(work, "signed-bytecode", PRECOMPILE_VERIFY_KEYS=build["verify_key"]))
    t = _child(a, work, f"torch,{build['key']},{build['cache']}", _fresh_env(work, "torch"))
    plain, with_prime = [], []
    for i in range(max(1, a.rounds)):  # alternating, so that the machine's drift hits both alike
        plain.append(_child(a, work, ours_phase, _fresh_env(work, f"ours{i}", **unprimed)))
        with_prime.append(_child(a, work, ours_phase, _fresh_env(work, f"ours-primed{i}", **primed)))
    o, o_pr = _medians(plain), _medians(with_prime)
    eager = _child(a, work, "eager", _fresh_env(work, "eager"))
    w = _child(a, work, f"ours-warm,{build['key']},{build['cache']}", _fresh_env(work, "ours-warm"))
    unsigned, signed = [], []
    for i in range(max(1, a.repeat)):  # alternating, so that the machine's drift hits both alike
        unsigned.append(_child(a, work, f"ours,{build['key']},{build['cache']}", _fresh_env(work, f"ours-u{i}")))
        signed.append(_child(a, work, f"ours,{build['key']},{build['signed_cache']}",
                             {**_fresh_env(work, f"ours-s{i}"), "PRECOMPILE_VERIFY_KEYS": build["verify_key"]}))
    sg = {"load_s": statistics.median(r["load_s"] for r in signed), "matches": all(r["matches"] for r in signed)}
    unsigned_s = statistics.median(r["load_s"] for r in unsigned)
    crypto = _child(a, work, "crypto-import", _fresh_env(work, "crypto"))
    concurrent = []
    if a.concurrent:
        # all N processes import torch and read their inputs first; then the N loads start together
        ready, go = work / "ready", work / "go"
        ready.mkdir(exist_ok=True)
        procs = [_start_child(a, work, f"ours,{build['key']},{build['cache']}",
                              {**_fresh_env(work, f"ours{i}"), "BENCH_READY_DIR": str(ready),
                               "BENCH_GO_FILE": str(go)})
                 for i in range(a.concurrent)]
        while len(list(ready.iterdir())) < a.concurrent:
            if any(p.poll() is not None for p in procs):
                break  # _finish_child reports the failure
            time.sleep(0.01)
        go.touch()
        concurrent = [_finish_child(p)["load_s"] for p in procs]
    import torch

    result = {
        "model": a.model, "rounds": max(1, a.rounds), "key": build["key"], "cache": build["cache"],
        "workdir": str(work), "shape": a.shape, "device": a.device, "dtype": a.dtype or "float32",
        "options": json.loads(a.options) if a.options else {}, "torch": torch.__version__,
        "compile_s": build["precompile_compile_s"], "torch_compile_s": build["torch_compile_s"],
        "torch_load_s": t["load_s"], "precompile_load_s": o["load_s"],
        "speedup": t["load_s"] / o["load_s"] if o["load_s"] else None,
        "torch_first_call_s": t["first_call_s"], "first_call_s": o["first_call_s"],
        "second_call_s": o["second_call_s"], "eager_first_call_s": eager["first_call_s"],
        "torch_ttfo_s": t["load_s"] + t["first_call_s"], "ttfo_s": o["load_s"] + o["first_call_s"],
        "ttfo_speedup": (t["load_s"] + t["first_call_s"]) / (o["load_s"] + o["first_call_s"]),
        "ttfo_vs_second": (o["load_s"] + o["first_call_s"]) / (o["load_s"] + o["second_call_s"]),
        "primed_load_s": o_pr["load_s"], "primed_first_call_s": o_pr["first_call_s"],
        "primed_ttfo_s": o_pr["load_s"] + o_pr["first_call_s"],
        "primed_ttfo_speedup": (t["load_s"] + t["first_call_s"]) / (o_pr["load_s"] + o_pr["first_call_s"]),
        "primed_ttfo_vs_second": (o_pr["load_s"] + o_pr["first_call_s"]) / (o_pr["load_s"] + o_pr["second_call_s"]),
        "torch_steady_call_ms": t["steady_call_ms"], "steady_call_ms": o["steady_call_ms"],
        "compiled_call_ms": build["compiled_call_ms"],
        "paired_steady_ms": {"fresh_compile": build["paired_fresh_ms"], "loaded": build["paired_loaded_ms"],
                             "loaded_engine": build["paired_engine"]},
        "paired_loaded_vs_fresh": build["paired_loaded_ms"] / build["paired_fresh_ms"],
        "torch_peak_extra_rss_mb": t["peak_extra_rss_mb"], "peak_extra_rss_mb": o["peak_extra_rss_mb"],
        "outputs_match": {"torch": t["matches"], "precompile": o["matches"], "precompile_own_compile": o["matches_own"]},
        "max_abs_diff": {"torch": t["max_abs_diff"], "precompile": o["max_abs_diff"]},
        "artifact_bytes": build["artifact_bytes"], "torch_artifact_bytes": build["torch_artifact_bytes"],
        "kernels": build["kernels"], "placeholders": build["placeholders"],
        "engine": o["engine"],
        "warm_load_s": w["load_s"], "warm_first_call_s": w["first_call_s"], "warm_steady_call_ms": w["steady_call_ms"],
        "warm_speedup": t["load_s"] / w["load_s"] if w["load_s"] else None,
        "signed_load_s": sg["load_s"], "unsigned_load_s": unsigned_s, "repeat": max(1, a.repeat),
        "signed_speedup": t["load_s"] / sg["load_s"] if sg["load_s"] else None,
        "signed_vs_unsigned": sg["load_s"] / unsigned_s if unsigned_s else None, "verify_ms": build["verify_ms"],
        "crypto_import_ms": crypto["crypto_import_ms"],
        "manifest_bytes": build["manifest_bytes"], "signed_outputs_match": sg["matches"],
    }
    if concurrent:
        result["concurrent_loads"] = len(concurrent)
        result["concurrent_load_s_max"] = max(concurrent)
        result["concurrent_load_s_median"] = statistics.median(concurrent)
        result["concurrent_vs_lone"] = max(concurrent) / o["load_s"]
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(result) + "\n")
    if a.json:
        print(json.dumps(result))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"load benchmark: {a.model} {a.shape} on {a.device} ({result['dtype']}, options "
                        f"{result['options'] or '{}'}), torch {torch.__version__}")
    for col in ("", "torch CompiledArtifact", "precompile", "ratio torch/ours"):
        table.add_column(col, justify="right")

    def row(name, tv, ov, fmt):
        table.add_row(name, fmt.format(tv), fmt.format(ov), f"{tv / ov:.2f}x" if ov else "-")

    row("cold compile s", result["torch_compile_s"], result["compile_s"], "{:.2f}")
    row("fresh-process load s", result["torch_load_s"], result["precompile_load_s"], "{:.3f}")
    row("first call s", result["torch_first_call_s"], result["first_call_s"], "{:.4f}")
    row("load + first call s", result["torch_ttfo_s"], result["ttfo_s"], "{:.3f}")
    row("steady call ms", result["torch_steady_call_ms"], result["steady_call_ms"], "{:.3f}")
    row("peak extra RSS MiB", result["torch_peak_extra_rss_mb"], result["peak_extra_rss_mb"], "{:.1f}")
    row("artifact bytes", result["torch_artifact_bytes"], result["artifact_bytes"], "{:,}")
    con = Console(width=120)
    con.print(table)
    con.print(f"freshly compiled steady call: {result['compiled_call_ms']:.3f} ms; outputs equal to the fresh "
              f"compile: torch {t['matches']}, precompile {o['matches']} (to its own fresh compile, which "
              f"precompile.key.passes may have rewritten: {o['matches_own']}); precompile engine: {o['engine']}")
    con.print(f"steady call, loaded vs fresh compile alternating in one process: {build['paired_loaded_ms']:.3f} vs "
              f"{build['paired_fresh_ms']:.3f} ms ({100 * (result['paired_loaded_vs_fresh'] - 1):+.1f}%, "
              f"{build['paired_engine']} engine)")
    con.print(f"with load(warmup=True) (weights bound, one call on zeros inside the load): load "
              f"{w['load_s']:.3f} s ({result['warm_speedup']:.1f}x faster than torch's), first call "
              f"{w['first_call_s']:.4f} s, steady {w['steady_call_ms']:.3f} ms")
    con.print(f"signed: load {sg['load_s']:.3f} s with PRECOMPILE_VERIFY_KEYS set against {unsigned_s:.3f} s unsigned "
              f"(medians of {result['repeat']} alternating fresh processes: {result['signed_vs_unsigned']:.2f}x; "
              f"{result['signed_speedup']:.1f}x faster than torch's); the signature check alone "
              f"{build['verify_ms']:.2f} ms for a {build['manifest_bytes']:,}-byte manifest, importing cryptography's "
              f"Ed25519 {result['crypto_import_ms']:.1f} ms once per process")
    con.print(f"time to first output (load + first call; ours: medians of {result['rounds']} fresh processes): "
              f"ours without priming (PRECOMPILE_PRIME=off) {result['ttfo_s']:.3f} s = {result['ttfo_vs_second']:.2f}x "
              f"our load + second call ({o['load_s'] + o['second_call_s']:.3f} s), {result['ttfo_speedup']:.1f}x "
              f"faster than torch's {result['torch_ttfo_s']:.3f} s; with the graph's library calls replayed beside the "
              f"load (PRECOMPILE_PRIME=all; on, GPU graphs, is the default) {result['primed_ttfo_s']:.3f} s (load "
              f"{o_pr['load_s']:.3f} + first call {o_pr['first_call_s']:.4f}) = {result['primed_ttfo_vs_second']:.2f}x "
              f"its load + second call ({o_pr['load_s'] + o_pr['second_call_s']:.3f} s), "
              f"{result['primed_ttfo_speedup']:.1f}x faster than torch's; eager's first call in a fresh process "
              f"{eager['first_call_s']:.4f} s")
    if concurrent:
        con.print(f"{len(concurrent)} precompile loads at once: max {max(concurrent):.3f} s, median "
                  f"{statistics.median(concurrent):.3f} s ({result['concurrent_vs_lone']:.2f}x a lone load)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
