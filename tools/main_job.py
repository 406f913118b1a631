#!/usr/bin/env python
"""The main job: warm a cache with real models, then serve them from it in a fresh worker process.

1. ``precompile warmup`` compiles all-MiniLM-L6-v2 (real weights) and a small Llama (random weights) for a few
   shapes into the cache (default: the embedded local cache, ``$XDG_CACHE_HOME/precompile``).
2. A fresh worker process compiles the same models with ``torch.compile(backend=precompile.backend(...))``:
   every graph must come from the cache.  It checks MiniLM's sentence embeddings against eager (cosine >=
   0.9999) and the Llama's logits (allclose), and prints the hit rate, load vs compile seconds and bytes stored.

What each number of the summary is:
- hit rate: this worker's lookups only (the difference of the cache's hits and misses counters over its run);
  ``precompile stats`` counts every lookup since the cache was created, the warmup's misses included.
- warmup wall: seconds the warmup step took (its builds run in parallel processes); build seconds summed: the
  Inductor compile seconds each artifact recorded, added up over artifacts (more than the wall time when builds
  ran in parallel); load seconds summed: this worker's loads, added up.
- logical bytes: each artifact's parts, uncompressed, added up over artifacts (parts two artifacts share count
  twice); stored bytes: what the cache holds, compressed, each blob once.

Exit status 0 only if every check passes and the worker's hit rate is 100%.

    python tools/main_job.py                      # the README's command one
    python tools/main_job.py --device cuda --dtype bfloat16 --recipes llama --shapes 4x256
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

COSINE_MIN = 0.9999


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", default=None, help="cache URL (default: $PRECOMPILE_CACHE or the local default)")
    p.add_argument("--recipes", default="minilm,llama", help="comma-separated recipes")
    p.add_argument("--shapes", default="1x16,4x32", help="comma-separated BATCHxSEQ")
    p.add_argument("--config", default=None, help="config overrides for the transformers recipes (JSON)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None)
    p.add_argument("--options", default=None, help="Inductor options JSON")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--skip-warmup", action="store_true", help="only run the worker")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", dest="json_out", default=None, help="also write the worker's results to this file")
    p.add_argument("--warmup-wall", type=float, default=None, help=argparse.SUPPRESS)
    return p.parse_args()


def _cache_url(args: argparse.Namespace) -> str:
    """The cache URL as given, checked by opening it here (and the cache made); not the cache's ``url``, whose
    secrets are masked: it would not reopen a cache behind a password."""
    from precompile import config
    from precompile.store.opening import open_cache

    open_cache(args.cache).close()
    return args.cache or config.default_cache_url()


def warm(args: argparse.Namespace, url: str) -> float:
    from cache_backends.redaction import redact_url

    start = time.perf_counter()
    for recipe in args.recipes.split(","):
        cmd = [sys.executable, "-m", "precompile", "warmup", recipe, "--shapes", args.shapes, "--cache", url,
               "--jobs", str(args.jobs), "--device", args.device]
        if args.dtype:
            cmd += ["--dtype", args.dtype]
        if args.options:
            cmd += ["--options", args.options]
        if args.config and recipe != "minilm":
            cmd += ["--config", args.config]
        print("$", " ".join(redact_url(c) if c == url else c for c in cmd[2:]), flush=True)
        subprocess.run(cmd, check=True)
    return time.perf_counter() - start


def worker(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    import precompile
    from precompile.cli import human_bytes, setup_logging
    from precompile.recipes.catalog import get_recipe, parse_shapes

    setup_logging(quiet=True)
    cache = precompile.open_cache(args.cache)
    before = cache.counters()
    options = json.loads(args.options) if args.options else None
    rows, ok = [], True
    for name in args.recipes.split(","):
        recipe = get_recipe(name, config=None if name == "minilm" else args.config, device=args.device,
                            dtype=args.dtype)
        model = recipe.model()
        for shape in parse_shapes(args.shapes):
            inputs = recipe.example_inputs(shape)
            with torch.no_grad():
                expected = recipe.postprocess(model(*inputs), inputs)
                be = precompile.backend(cache, options=options)
                torch._dynamo.reset()
                compiled = torch.compile(model, backend=be, dynamic=False)
                t0 = time.perf_counter()
                got = recipe.postprocess(compiled(*inputs), inputs)
                first_call = time.perf_counter() - t0
            exp32, got32 = expected.float(), got.float()
            if name == "minilm":
                metric = torch.nn.functional.cosine_similarity(exp32, got32, dim=-1).min().item()
                passed = metric >= COSINE_MIN
                check = f"cosine min {metric:.6f}"
            elif expected.dtype == torch.float32:
                passed = torch.allclose(got32, exp32, rtol=1e-4, atol=1e-4)
                metric = (got32 - exp32).abs().max().item()
                check = f"allclose, max |diff| {metric:.2e}"
            else:
                # bf16/fp16: eager and compiled round differently, so both are measured against a float32 run
                # of the same weights; compiled must be as accurate as eager (relative error within 1.5x + 1e-3)
                import copy

                with torch.no_grad():
                    ref = recipe.postprocess(copy.deepcopy(model).float()(*inputs), inputs).float()
                del_ref = (ref.norm() + 1e-12)
                err_c = ((got32 - ref).norm() / del_ref).item()
                err_e = ((exp32 - ref).norm() / del_ref).item()
                passed = err_c <= 1.5 * err_e + 1e-3
                metric = err_c
                check = f"rel err vs fp32: compiled {err_c:.2e}, eager {err_e:.2e}"
            ok &= passed
            for r in be.records:
                rows.append({"recipe": name, "shape": str(shape), "key": r.key, "outcome": r.outcome,
                             "load_s": r.seconds, "compile_s": r.compile_seconds, "first_call_s": first_call,
                             "check": check, "passed": passed, "bytes": r.bytes})
    after = cache.counters()
    hits = after["hits"] - before["hits"]
    misses = after["misses"] - before["misses"]
    rate = hits / (hits + misses) if hits + misses else 0.0
    stats = cache.stats()

    table = Table(title=f"fresh worker, cache {cache.url}",
                  caption="load s: this worker's load; build s: the artifact's recorded Inductor compile; "
                          "bytes: the artifact's parts, uncompressed")
    for col in ("model", "shape", "key", "from", "load s", "build s", "load/build", "bytes", "check"):
        table.add_column(col, justify="right" if col in ("load s", "build s", "load/build", "bytes") else "left")
    for r in rows:
        table.add_row(r["recipe"], r["shape"], r["key"][:12], "cache" if r["outcome"] == "hit" else "[red]built",
                      f"{r['load_s']:.2f}", f"{r['compile_s']:.2f}",
                      f"{r['load_s'] / r['compile_s']:.3f}" if r["compile_s"] else "-", human_bytes(r["bytes"]),
                      ("[green]" if r["passed"] else "[red]FAIL ") + r["check"])
    con = Console(width=140)
    con.print(table)
    load_total = sum(r["load_s"] for r in rows)
    compile_total = sum(r["compile_s"] for r in rows)
    logical = sum(r["bytes"] for r in rows)
    stored = stats.get("bytes_stored")
    con.print(f"this worker's hit rate {100 * rate:.1f}% ({hits} hits, {misses} misses: the change in the cache's "
              "counters over this run; `precompile stats` counts every lookup since the cache was created)")
    wall = f"warmup {args.warmup_wall:.1f} s wall; " if args.warmup_wall is not None else ""
    ratio = compile_total / max(load_total, 1e-9)
    con.print(f"time: {wall}builds {compile_total:.2f} s summed over {len(rows)} artifacts (parallel builds: not "
              f"wall time); this worker's loads {load_total:.2f} s summed ({ratio:.1f}x less)")
    con.print(f"bytes: {human_bytes(logical)} logical (each artifact's parts, uncompressed, summed; shared parts "
              f"counted per artifact); {human_bytes(stored) if isinstance(stored, int) else 'unknown'} stored "
              f"(compressed, each blob once) in {cache.url}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"rows": rows, "hit_rate": rate, "hits": hits, "misses": misses, "stats": stats,
                       "warmup_wall_seconds": args.warmup_wall, "build_seconds_summed": compile_total,
                       "load_seconds_summed": load_total, "logical_bytes": logical, "stored_bytes": stored,
                       "counters_reported": "this worker's change in hits and misses"}, f, indent=1)
    if not ok:
        con.print("[red]a model's output differs from eager")
    if rate < 1.0:
        con.print("[red]the worker missed the cache")
    return 0 if ok and rate == 1.0 else 1


def main() -> int:
    args = _parse()
    if args.worker:
        return worker(args)
    url = _cache_url(args)
    seconds = None
    if not args.skip_warmup:
        seconds = warm(args, url)
        print(f"warmup done in {seconds:.1f} s wall", flush=True)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--cache", url, "--recipes", args.recipes,
           "--shapes", args.shapes, "--device", args.device]
    if seconds is not None:
        cmd += ["--warmup-wall", f"{seconds:.3f}"]
    for flag, value in (("--dtype", args.dtype), ("--options", args.options), ("--config", args.config),
                        ("--json", args.json_out)):
        if value:
            cmd += [flag, value]
    print("$ fresh worker process: tools/main_job.py --worker ...", flush=True)
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
