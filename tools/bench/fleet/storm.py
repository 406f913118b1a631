"""One storm: N worker processes (:mod:`tools.bench.fleet.worker`) released at once on a target, with progress, node
sampling (:class:`tools.bench.fleet.targets.Sampler`) and an optional fault run in a thread from GO on.

Every worker has its own empty ``TORCHINDUCTOR_CACHE_DIR`` and ``XDG_CACHE_HOME`` (only the cache URL is shared),
``PYTHONDONTWRITEBYTECODE`` removed (:func:`warm_bytecode` writes the ``.pyc`` files once, before any storm), and
its stdout and stderr in files (a pipe that fills would block a worker).
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tools.bench.fleet.targets import Sampler, Target

log = logging.getLogger("bench_fleet")
ROOT = Path(__file__).resolve().parents[3]
BUILDS = ("built", "takeover")


def worker_env(wdir: Path) -> dict[str, str]:
    """A worker's environment: its own empty Inductor and XDG cache dirs, bytecode caching on, this checkout first."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PRECOMPILE_CACHE")}
    for var, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("XDG_CACHE_HOME", "xdg")):
        (wdir / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(wdir / sub)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return env


def warm_bytecode(work: Path) -> None:
    """Import what a worker imports, and compile this checkout's modules, with ``PYTHONDONTWRITEBYTECODE`` unset:
    the ``.pyc`` files are written once here, so that no worker compiles source at its start."""
    code = ("import compileall, torch, precompile, tools.bench.fleet.worker as w; import precompile.builder.standalone; "
            "w.graph(0); compileall.compile_dir('precompile', quiet=1); compileall.compile_dir('cache_backends', "
            "quiet=1); compileall.compile_dir('tools', quiet=1)")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=worker_env(work / "warm"), check=True)


@dataclass
class Run:
    """A storm in progress, as a fault sees it."""

    target: Target
    url: str
    procs: list[subprocess.Popen]
    go_at: float
    base: Path
    killed: set[int] = field(default_factory=set)  # pids a fault killed on purpose

    def done(self) -> int:
        return len(list((self.base / "done").iterdir())) if (self.base / "done").exists() else 0

    def building(self) -> list[int]:
        d = self.base / "building"
        return [int(p.name) for p in d.iterdir()] if d.exists() else []


def mem_available() -> int:
    """``MemAvailable`` of ``/proc/meminfo``, bytes (0 where it is not found)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100): with 16 values p99 is the largest."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def run_storm(target: Target, url: str, n: int, keys: int, base: Path, label: str, *, timeout: float = 900,
              fault: Callable[[Run], dict] | None = None) -> dict:
    """Start ``n`` workers on ``url``, release them at once, wait for all; the storm's summary (see
    :func:`summarize`), with the fault's own report under ``"fault"``."""
    base.mkdir(parents=True)
    ready, go = base / "ready", base / "GO"
    procs, outs = [], []
    for i in range(n):
        cmd = [sys.executable, "-m", "tools.bench.fleet.worker", "--url", url, "--ready", str(ready), "--go", str(go),
               "--done", str(base / "done"), "--building", str(base / "building"), "--index", str(i),
               "--keys", str(keys), "--timeout", str(timeout)]
        out, err = open(base / f"w{i}.out", "w"), open(base / f"w{i}.err", "w")
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=worker_env(base / f"w{i}"), stdout=out, stderr=err))
        outs.append((out, err))
    try:
        _wait_ready(procs, ready, base, label, timeout)
        target.refresh_roles()
        with Sampler(target.live()) as sampler:
            go_at = time.time()
            (base / "GO.tmp").write_text(repr(go_at))
            os.replace(base / "GO.tmp", go)
            run = Run(target, url, procs, go_at, base)
            fault_report: dict = {}
            thread = None
            if fault is not None:
                thread = threading.Thread(target=lambda: fault_report.update(fault(run)), name="fault", daemon=True)
                thread.start()
            _wait_done(run, label, timeout)
            if thread is not None:
                thread.join(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for out, err in outs:
            out.close()
            err.close()
    summary = summarize(run, sampler.deltas(), n, keys, label)
    if fault is not None:
        summary["fault"] = fault_report
    return summary


def _wait_ready(procs: list[subprocess.Popen], ready: Path, base: Path, label: str, timeout: float) -> None:
    deadline, shown = time.monotonic() + timeout, 0.0
    while True:
        count = len(list(ready.iterdir())) if ready.exists() else 0
        if count == len(procs):
            log.info("%s: %d workers ready (imports, graphs, eager outputs done), GO", label, count)
            return
        dead = [i for i, p in enumerate(procs) if p.poll() is not None]
        if dead:
            raise SystemExit(f"{label}: worker {dead[0]} exited before GO:\n"
                             f"{(base / f'w{dead[0]}.err').read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{label}: only {count}/{len(procs)} workers ready after {timeout:.0f} s")
        if time.monotonic() - shown > 5:
            log.info("%s: %d/%d workers ready", label, count, len(procs))
            shown = time.monotonic()
        time.sleep(0.05)


def _wait_done(run: Run, label: str, timeout: float) -> None:
    deadline, shown = time.monotonic() + timeout, time.monotonic()
    while any(p.poll() is None for p in run.procs):
        if time.monotonic() > deadline:
            raise SystemExit(f"{label}: workers still running {timeout:.0f} s after GO")
        if time.monotonic() - shown > 2:
            log.info("%s: %d/%d done, %d exited, %.1f s after GO", label, run.done(), len(run.procs),
                     sum(p.poll() is not None for p in run.procs), time.time() - run.go_at)
            shown = time.monotonic()
        time.sleep(0.02)
    log.info("%s: all %d exited, %.1f s after GO", label, len(run.procs), time.time() - run.go_at)


def summarize(run: Run, nodes: dict[int, dict], n: int, keys: int, label: str) -> dict:
    """Builds, seconds to first output, outputs against eager, crashes, and per node bytes, clients and CPU."""
    reports, crashed, warnings = [], [], Counter()
    for i, p in enumerate(run.procs):
        err = (run.base / f"w{i}.err").read_text(errors="replace")
        for line in err.splitlines():
            if "WARNING" in line or "Error" in line:
                warnings[_shape(line)] += 1
        if p.pid in run.killed:
            continue
        out = (run.base / f"w{i}.out").read_text().strip().splitlines()
        if p.returncode != 0 or not out:
            crashed.append({"worker": i, "rc": p.returncode, "stderr": err[-2000:]})
            continue
        reports.append(json.loads(out[-1]))
    per_key = [k for r in reports for k in r["keys"]]
    outcomes = Counter(k["outcome"] for k in per_key)
    ttfo = [r["ttfo_s"] for r in reports]
    served = sum(d["served_bytes"] for d in nodes.values())
    return {"label": label, "workers": n, "keys": keys, "survivors": len(reports), "killed": len(run.killed),
            "crashed": crashed, "outcomes": dict(outcomes), "builds": sum(outcomes[o] for o in BUILDS),
            "builds_per_key": sum(outcomes[o] for o in BUILDS) / keys,
            "compiled_workers": sum(r["compiled"] for r in reports),
            "wrong_outputs": sum(not k["allclose"] for k in per_key),
            "max_abs_diff": max((k["max_abs_diff"] for k in per_key), default=None),
            "ttfo_p50": statistics.median(ttfo) if ttfo else None, "ttfo_p99": percentile(ttfo, 99) if ttfo else None,
            "ttfo_max": max(ttfo) if ttfo else None, "worker_cpu_s": sum(r["cpu_s"] for r in reports),
            "worker_rss_mib": max((r["rss_mib"] for r in reports), default=None),
            "nodes": {str(port): d for port, d in nodes.items()}, "served_bytes": served,
            "peak_clients": sum(d["peak_clients"] for d in nodes.values()),
            "redis_cpu_s": sum(d["cpu_s"] for d in nodes.values()),
            "warnings": dict(warnings.most_common(8)),
            "artifact_keys": sorted({(k["k"], k["key"]) for k in per_key}),
            "artifact_bytes": sum({k["key"]: k["artifact_bytes"] for k in per_key}.values())}


def _shape(line: str) -> str:
    """A warning line without what varies between workers (times, ports, digits)."""
    import re

    return re.sub(r"\d+(\.\d+)?", "N", line.split(": ", 1)[-1])[:200]
