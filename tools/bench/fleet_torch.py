#!/usr/bin/env python
"""Fleet cold start: N workers compile one model at once through Redis — precompile vs torch's remote cache.

(This was ``bench_fleet.py`` until issue 29 gave that name to the storm benchmark, now ``python -m
tools.bench.fleet``; the commands of the 2026-11-22 section of docs/benchmarks.md are this tool's, with the same
flags.)

Fleet part.  For each N of ``--workers`` and each scenario, a fresh ``redis-server`` (empty, no persistence, on
a free loopback port) is started and N worker processes cold-start the same model at the same shape:

* ``precompile``: ``torch.compile(model, backend=precompile.backend(cache="redis://127.0.0.1:PORT/0"),
  dynamic=False)`` under ``no_grad``, called once.  Build leases make one worker compile each graph while
  the others wait for it and load it.
* ``torch``: plain ``torch.compile(model, dynamic=False)`` with Inductor's own Redis remote caches
  (``TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE=1``, ``TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE=1``,
  ``TORCHINDUCTOR_REDIS_HOST``/``_PORT``: the names read by torch/_inductor/config.py,
  torch/_functorch/config.py and torch/_inductor/remote_cache.py of torch 2.13).

Every worker has its own empty ``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR`` and ``XDG_CACHE_HOME``, so
the only thing shared is Redis, as between machines.  A worker imports torch, builds the model, its inputs and
the eager output, touches a ready file, and waits for the GO file; the parent writes GO (holding its
``time.time()``) once all N are ready.  From GO to the first compiled output each worker measures: Inductor
compiles run in the process (Dynamo's ``counters["inductor"]["fxgraph_cache_miss"]``; ``_hit`` too), CPU
seconds (``getrusage`` user+sys of ``RUSAGE_SELF`` plus ``RUSAGE_CHILDREN``, i.e. gcc, as deltas), and wall
seconds (what happens before GO — imports, the model, the eager run — is the same in both scenarios and not
counted); the output is checked against eager with ``allclose(rtol=1e-3, atol=1e-4)``.  The parent sums
compiles and CPU seconds, takes the slowest worker's wall seconds, and reads what Redis holds afterwards:
value bytes = ``STRLEN`` of every string key plus field and value lengths of every hash, and
``INFO memory`` ``used_memory_dataset`` minus its value on the empty server.

Throughput part.  On one more server (``--proto-max-bulk-len 1gb``): for 1, 8, 64 and 512 MiB of random bytes,
``RedisCache.get_blob`` (``open_cache("redis://...")``: chunked, raw where zstd does not pay, sha256-verified)
against one redis-py ``GET`` of the same bytes stored under one plain key; median of 3 reads each, MiB/s (both
clients with a 120 s socket timeout).  The 1-minute load average at start and end is reported: other work
sharing the cores shows in the wall and CPU seconds.

    python tools/bench/fleet_torch.py --workers 4,8
    python tools/bench/fleet_torch.py --workers 2 --skip-throughput --json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run by path: the repository root in place of this folder (tools/__init__.py)
    sys.path[0] = str(ROOT)

from tools._common import child_flag, free_port  # noqa: E402 - after the repository root is on the path

log = logging.getLogger("bench_fleet_torch")
SCENARIOS = ("precompile", "torch")
TORCH_REMOTE_ENV = ("TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE", "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE",
                    "TORCHINDUCTOR_REDIS_HOST", "TORCHINDUCTOR_REDIS_PORT", "TORCHINDUCTOR_REDIS_URL")


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama", help="recipe: llama, minilm, ..., or module:function")
    p.add_argument("--shape", default="1x32", help="one BATCHxSEQ")
    p.add_argument("--config", default=None, help="recipe config JSON")
    p.add_argument("--workers", default="4,8", help="fleet sizes, comma-separated")
    p.add_argument("--timeout", type=float, default=900, help="seconds a scenario's workers may take in all")
    p.add_argument("--sizes-mib", default="1,8,64,512", help="blob sizes of the throughput part, MiB")
    p.add_argument("--reads", type=int, default=3, help="reads per blob and reader (median reported)")
    p.add_argument("--skip-fleet", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--json-out", default=None, help="also write the JSON object to this file")
    p.add_argument("--workdir", default=None, help="keep worker dirs here (default: a temp dir, removed)")
    child_flag(p, "--worker", nargs=4, metavar=("SCENARIO", "URL", "READY_DIR", "GO_FILE"))
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------ redis
@contextmanager
def redis_server(workdir: Path, *extra: str):
    """A fresh ``redis-server`` on a free loopback port, no persistence; yields ``(port, client)``, then kills
    it and removes ``workdir``."""
    import redis

    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server not found (apt-get install redis-server)")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(workdir), "--protected-mode", "no", "--loglevel", "warning", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=120)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"redis-server on port {port} did not start") from None
                time.sleep(0.02)
        yield port, client
    finally:
        client.close()
        proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


def redis_bytes(client) -> tuple[int, int]:
    """``(keys, value bytes)``: STRLEN of each string key, field + value lengths of each hash."""
    keys, total = 0, 0
    for name in client.scan_iter(count=1000):
        keys += 1
        kind = client.type(name)
        if kind == b"string":
            total += client.strlen(name)
        elif kind == b"hash":
            total += sum(len(k) + len(v) for k, v in client.hgetall(name).items())
    return keys, total


def _dataset_bytes(client) -> int:
    return int(client.info("memory")["used_memory_dataset"])


# ----------------------------------------------------------------------------------------------- worker
def _cpu_s() -> float:
    """User + system CPU seconds of this process and its reaped children (gcc)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def run_worker(a: argparse.Namespace) -> dict:
    """One fleet worker (a fresh process): get ready, wait for GO, compile and call once; returns its report."""
    scenario, url, ready, go = a.worker[0], a.worker[1], Path(a.worker[2]), Path(a.worker[3])
    import torch
    from torch._dynamo.utils import counters

    import precompile
    from precompile.cli import setup_logging
    from precompile.recipes.catalog import get_recipe, parse_shapes

    setup_logging(quiet=True)
    recipe = get_recipe(a.model, config=a.config)
    (shape,) = parse_shapes(a.shape)
    model = recipe.model()
    inputs = recipe.example_inputs(shape)
    with torch.no_grad():
        want = recipe.postprocess(model(*inputs), inputs)
    be = precompile.backend(cache=url) if scenario == "precompile" else None
    (ready / str(os.getpid())).touch()
    deadline = time.monotonic() + a.timeout
    while not go.exists() or not go.read_text().strip():
        if time.monotonic() > deadline:
            raise SystemExit("the GO file never appeared")
        time.sleep(0.005)
    go_at = float(go.read_text())
    cpu0 = _cpu_s()
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(model, dynamic=False) if be is None else torch.compile(model, backend=be,
                                                                                        dynamic=False)
        got = recipe.postprocess(compiled(*inputs), inputs)
    done_at = time.time()
    cpu = _cpu_s() - cpu0
    inductor = counters["inductor"]
    return {"scenario": scenario, "pid": os.getpid(), "compiles": inductor["fxgraph_cache_miss"],
            "fx_hits": inductor["fxgraph_cache_hit"], "fx_bypass": inductor["fxgraph_cache_bypass"],
            "outcomes": [r.outcome for r in be.records] if be is not None else [],
            "cpu_s": cpu, "seconds": done_at - go_at, "done_at": done_at,
            "allclose": bool(torch.allclose(got, want, rtol=1e-3, atol=1e-4)),
            "max_abs_diff": float((got - want).abs().max())}


# ----------------------------------------------------------------------------------------------- parent
def _worker_env(wdir: Path, scenario: str, port: int) -> dict:
    """The environment of one worker: its own empty cache dirs; torch's remote-cache variables only for torch."""
    env = {k: v for k, v in os.environ.items() if k not in TORCH_REMOTE_ENV and k != "PRECOMPILE_CACHE"}
    for var, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"),
                     ("XDG_CACHE_HOME", "xdg")):
        (wdir / sub).mkdir(parents=True)
        env[var] = str(wdir / sub)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if scenario == "torch":
        env.update({"TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "1",
                    "TORCHINDUCTOR_REDIS_HOST": "127.0.0.1", "TORCHINDUCTOR_REDIS_PORT": str(port)})
    return env


def run_fleet(a: argparse.Namespace, scenario: str, n: int, work: Path) -> dict:
    """Start a fresh Redis and ``n`` workers of ``scenario``, release them at once; the scenario's summary."""
    base = work / f"{scenario}-{n}"
    ready, go = base / "ready", base / "GO"
    ready.mkdir(parents=True)
    with redis_server(base / "redis") as (port, client):
        empty = _dataset_bytes(client)
        url = f"redis://127.0.0.1:{port}/0"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--model", a.model, "--shape", a.shape,
               "--timeout", str(a.timeout), "--worker", scenario, url, str(ready), str(go)]
        cmd += ["--config", a.config] if a.config else []
        procs = [subprocess.Popen(cmd, env=_worker_env(base / f"w{i}", scenario, port), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for i in range(n)]
        deadline = time.monotonic() + a.timeout
        while len(list(ready.iterdir())) < n:
            dead = [p for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                err = dead[0].communicate()[1][-3000:] if dead else "timed out"
                raise SystemExit(f"a {scenario} worker failed before GO:\n{err}")
            time.sleep(0.05)
        log.info("%s x%d: all ready, GO", scenario, n)
        go_at = time.time()
        (base / "GO.tmp").write_text(repr(go_at))
        os.replace(base / "GO.tmp", go)
        reports = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise SystemExit(f"{scenario} x{n}: workers still running after {a.timeout:.0f} s") from None
            if p.returncode != 0:
                raise SystemExit(f"a {scenario} worker exited with {p.returncode}:\n{err[-4000:]}")
            reports.append(json.loads(out.strip().splitlines()[-1]))
        keys, value_bytes = redis_bytes(client)
        dataset = _dataset_bytes(client) - empty
    outcomes: dict[str, int] = {}
    for r in reports:
        for o in r["outcomes"]:
            outcomes[o] = outcomes.get(o, 0) + 1
    summary = {"scenario": scenario, "workers": n, "compiles": sum(r["compiles"] for r in reports),
               "fx_hits": sum(r["fx_hits"] for r in reports), "outcomes": outcomes,
               "cpu_s": sum(r["cpu_s"] for r in reports), "wall_s": max(r["done_at"] for r in reports) - go_at,
               "median_worker_s": statistics.median(r["seconds"] for r in reports),
               "all_allclose": all(r["allclose"] for r in reports),
               "max_abs_diff": max(r["max_abs_diff"] for r in reports), "redis_keys": keys,
               "redis_value_bytes": value_bytes, "redis_dataset_bytes": dataset, "per_worker": reports}
    log.info("%s x%d: %d compiles, %.1f CPU s, %.1f s wall, outcomes %s", scenario, n, summary["compiles"],
             summary["cpu_s"], summary["wall_s"], outcomes or "-")
    return summary


def run_throughput(a: argparse.Namespace, work: Path) -> list[dict]:
    """MiB/s of ``RedisCache.get_blob`` and of one raw ``GET``, per blob size (median of ``a.reads`` reads)."""
    from cache_backends import open_cache

    rows = []
    with redis_server(work / "redis-throughput", "--proto-max-bulk-len", "1gb") as (port, client):
        cache = open_cache(f"redis://127.0.0.1:{port}/0?timeout=120")
        for mib in (int(s) for s in a.sizes_mib.split(",")):
            data = os.urandom(mib << 20)
            digest = cache.put_blob(data)
            client.set("raw", data)
            readers = {"precompile": partial(cache.get_blob, digest), "raw": partial(client.get, "raw")}
            times: dict[str, list[float]] = {name: [] for name in readers}
            for _ in range(a.reads):
                for name, read in readers.items():
                    t = time.perf_counter()
                    got = read()
                    times[name].append(time.perf_counter() - t)
                    if bytes(got) != data:
                        raise SystemExit(f"{name} read of {mib} MiB returned other bytes")
                    del got
            row = {"mib": mib, **{f"{k}_s": statistics.median(v) for k, v in times.items()}}
            row["precompile_mib_s"], row["raw_mib_s"] = mib / row["precompile_s"], mib / row["raw_s"]
            row["ratio_raw_over_precompile"] = row["precompile_s"] / row["raw_s"]
            rows.append(row)
            log.info("%d MiB: precompile %.0f MiB/s, raw GET %.0f MiB/s", mib, row["precompile_mib_s"],
                     row["raw_mib_s"])
            client.flushdb()
            del data
        cache.close()
    return rows


def _ratios(fleet: list[dict]) -> list[dict]:
    """torch / precompile for compiles, CPU seconds and wall seconds, per N."""
    by = {(r["scenario"], r["workers"]): r for r in fleet}
    out = []
    for n in sorted({r["workers"] for r in fleet}):
        t, p = by.get(("torch", n)), by.get(("precompile", n))
        if t and p:
            out.append({"workers": n, **{k: (t[k] / p[k] if p[k] else None) for k in ("compiles", "cpu_s", "wall_s")}})
    return out


def _print(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=140)
    if result["fleet"]:
        t = Table(title=f"fleet cold start: {result['model']} {result['shape']}, torch {result['torch']}, "
                        f"{result['cpus']} CPUs, one fresh Redis per row")
        for col in ("scenario", "N", "Inductor compiles", "fx hits", "precompile outcomes", "CPU s (sum)",
                    "wall s (max)", "median worker s", "Redis value bytes", "dataset bytes", "allclose"):
            t.add_column(col, justify="right")
        for r in result["fleet"]:
            t.add_row(r["scenario"], str(r["workers"]), str(r["compiles"]), str(r["fx_hits"]),
                      ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items())) or "-", f"{r['cpu_s']:.1f}",
                      f"{r['wall_s']:.1f}", f"{r['median_worker_s']:.1f}", f"{r['redis_value_bytes']:,}",
                      f"{r['redis_dataset_bytes']:,}", "yes" if r["all_allclose"] else "NO")
        con.print(t)
        t = Table(title="ratios torch / precompile")
        for col in ("N", "compiles", "CPU s", "wall s"):
            t.add_column(col, justify="right")
        for r in result["ratios"]:
            t.add_row(str(r["workers"]), *(f"{r[k]:.2f}x" if r[k] else "-" for k in ("compiles", "cpu_s", "wall_s")))
        con.print(t)
        con.print(f"1-minute load average: {result['loadavg_start']:.2f} at start, {result['loadavg_end']:.2f} at end")
    if result["throughput"]:
        t = Table(title=f"blob fetch, median of {result['reads']} reads (MiB/s)")
        for col in ("blob MiB", "precompile get_blob", "raw GET", "raw / precompile"):
            t.add_column(col, justify="right")
        for r in result["throughput"]:
            t.add_row(str(r["mib"]), f"{r['precompile_mib_s']:.0f}", f"{r['raw_mib_s']:.0f}",
                      f"{r['ratio_raw_over_precompile']:.2f}x")
        con.print(t)


def main(argv=None) -> int:
    a = _args(argv)
    if a.worker:
        print(json.dumps(run_worker(a)))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stderr)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="bench-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    import torch

    result = {"model": a.model, "shape": a.shape, "config": a.config, "torch": torch.__version__,
              "cpus": os.cpu_count(), "reads": a.reads, "loadavg_start": os.getloadavg()[0],
              "fleet": [], "ratios": [], "throughput": []}
    try:
        if not a.skip_fleet:
            for n in (int(s) for s in a.workers.split(",")):
                for scenario in SCENARIOS:
                    result["fleet"].append(run_fleet(a, scenario, n, work))
            result["ratios"] = _ratios(result["fleet"])
        if not a.skip_throughput:
            result["throughput"] = run_throughput(a, work)
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    result["loadavg_end"] = os.getloadavg()[0]  # other work on the machine shares its cores
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(result) + "\n")
    if a.json:
        print(json.dumps(result))
    else:
        _print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
