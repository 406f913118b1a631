"""Faults injected during a storm, each on a fresh target seeded from a bundle (``precompile export``/``import``).

Each fault is a function ``fault(run) -> dict`` that :func:`tools.bench.fleet.storm.run_storm` runs in a thread from
GO on; :data:`FAULTS` says how each one's storm is set up (which keys are stored beforehand, extra URL options).

- ``kill-master``: ``kill -9`` of the master holding the most stored bytes (other than the URL's node),
  ``delay_s`` after GO, while the workers load (every key stored).  Its replica is promoted after
  ``cluster-node-timeout``; the seconds until the cluster is ``ok`` again are reported.  Cluster only.
- ``kill-builder``: key 0 is not stored, the lease TTL is 5 s; the first worker that starts Inductor's compiler
  (the build-lease holder: a load never imports it) is killed with SIGKILL.  Another worker takes the lease over
  once it expires.
- ``oom``: key 0 is not stored; the moment a worker starts building it, every master gets ``maxmemory 1`` with
  ``maxmemory-policy noeviction``, so that the store is refused (OOM).  Set back to 0 after the storm.
- ``kill-seed`` (only by name): ``kill -9`` at GO of the master the URL names, the node every worker asks for the
  cluster's slot map when it opens the cache.
- ``stop-node``: ``SIGSTOP`` of the master holding the most stored bytes (other than the URL's node),
  ``delay_s`` after GO, for the socket
  timeout plus 2 s, then ``SIGCONT`` (in a cluster with a 1 s node timeout the replica is promoted meanwhile, and
  the old master comes back as a replica).

After each: every worker but one a fault killed must exit 0, every output must be allclose to eager, and
``precompile verify`` must find nothing damaged in the target.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time

from tools.bench.fleet.storm import ROOT, Run, worker_env
from tools.bench.fleet.targets import Node, Target

log = logging.getLogger("bench_fleet")

#: Socket timeout of the storms' URLs (precompile's default): the stop lasts longer than this.
SOCKET_TIMEOUT_S = 5.0


def hot_master(target: Target, url: str, seed: bool = False) -> Node:
    """The master holding the most stored bytes (``used_memory_dataset``) now, other than the node ``url`` names
    (the seed its clients ask for the slot map); with ``seed``, that node."""
    masters = target.masters()
    named = [n for n in masters if f":{n.port}/" in url]
    if seed or target.kind != "cluster":
        return (named or masters)[0]
    return max((n for n in masters if n not in named), key=lambda n: int(n.info("memory")["used_memory_dataset"]))


def _wait_for(run: Run, what, timeout: float = 300) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        if all(p.poll() is not None for p in run.procs):
            return None
        time.sleep(0.005)
    return None


def kill_master(delay_s: float, seed: bool = False):
    def fault(run: Run) -> dict:
        victim = hot_master(run.target, run.url, seed)
        time.sleep(max(0.0, run.go_at + delay_s - time.time()))
        at = time.time() - run.go_at
        done = run.done()
        victim.signal(signal.SIGKILL)
        log.info("fault: kill -9 %s at %.2f s after GO (%d workers done)", victim.name, at, done)
        report = {"victim": victim.name, "at_s": round(at, 3), "done_before": done}
        if run.target.kind == "cluster":
            started = time.monotonic()
            run.target.wait_ok(timeout=60)
            report["promoted_after_s"] = round(time.monotonic() - started + 0.0, 2)
            report["new_masters"] = [n.name for n in run.target.masters()]
        return report
    return fault


def stop_node(delay_s: float, stop_s: float = SOCKET_TIMEOUT_S + 2):
    def fault(run: Run) -> dict:
        victim = hot_master(run.target, run.url)
        time.sleep(max(0.0, run.go_at + delay_s - time.time()))
        at = time.time() - run.go_at
        victim.signal(signal.SIGSTOP)
        log.info("fault: SIGSTOP %s at %.2f s after GO for %.1f s", victim.name, at, stop_s)
        time.sleep(stop_s)
        victim.signal(signal.SIGCONT)
        report = {"victim": victim.name, "at_s": round(at, 3), "stopped_s": stop_s}
        if run.target.kind == "cluster":
            run.target.wait_ok(timeout=60)
            victim_role = "replica" if victim in run.target.live() and victim.info("replication")["role"] != \
                "master" else "master"
            report["victim_after"] = victim_role
        return report
    return fault


def kill_builder(run: Run) -> dict:
    pids = _wait_for(run, run.building)
    if not pids:
        return {"error": "no worker started a build"}
    pid = pids[0]
    proc = next(p for p in run.procs if p.pid == pid)
    run.killed.add(pid)
    proc.send_signal(signal.SIGKILL)
    at = time.time() - run.go_at
    log.info("fault: kill -9 of the builder (pid %d) at %.2f s after GO", pid, at)
    return {"killed_pid": pid, "at_s": round(at, 3)}


def oom(run: Run) -> dict:
    pids = _wait_for(run, run.building)
    if not pids:
        return {"error": "no worker started a build"}
    at = time.time() - run.go_at
    for m in run.target.masters():
        c = m.client()
        c.config_set("maxmemory-policy", "noeviction")
        c.config_set("maxmemory", 1)
        c.close()
    log.info("fault: maxmemory 1 (noeviction) on every master at %.2f s after GO (worker %d builds)", at, pids[0])
    return {"builder_pid": pids[0], "at_s": round(at, 3)}


def oom_undo(target: Target) -> None:
    for m in target.masters():
        c = m.client()
        c.config_set("maxmemory", 0)
        c.close()


#: name -> (fault factory taking the delay, keys left out of the seed, extra URL options, clean-up)
FAULTS = {
    "kill-master": (kill_master, (), {}, None),
    "kill-builder": (lambda delay: kill_builder, (0,), {"lease_ttl": 5}, None),
    "oom": (lambda delay: oom, (0,), {}, oom_undo),
    "stop-node": (stop_node, (), {}, None),
    "kill-seed": (lambda delay: kill_master(0.0, seed=True), (), {}, None),
}
#: What ``--faults`` runs: ``kill-seed`` (the URL's node lost before the workers connect) is asked for by name.
DEFAULT_FAULTS = ("kill-master", "kill-builder", "oom", "stop-node")


# ------------------------------------------------------------------------------------------------ the CLI
def cli(*args: str, env_dir, check: bool = True) -> subprocess.CompletedProcess:
    """``python -m precompile ARGS`` in a fresh process (the product's own command line)."""
    env_dir.mkdir(parents=True, exist_ok=True)
    res = subprocess.run([sys.executable, "-m", "precompile", "-q", *args], cwd=ROOT, env=worker_env(env_dir),
                         capture_output=True, text=True, timeout=600)
    if check and res.returncode != 0:
        raise SystemExit(f"precompile {' '.join(args)} exited with {res.returncode}:\n{res.stderr[-3000:]}")
    return res


def verify(url: str, env_dir) -> dict:
    """``precompile verify --json`` of ``url``: ``{"ok": bool, "problems": [...], "refs": n, "blobs": n}``."""
    res = cli("verify", "--cache", url, "--json", env_dir=env_dir, check=False)
    try:
        doc = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"ok": False, "problems": [f"verify exited with {res.returncode}: {res.stderr[-500:]}"]}
    tiers = doc.get("tiers", [])
    return {"ok": bool(doc.get("ok")) and res.returncode == 0,
            "refs": sum(t.get("refs_checked", 0) for t in tiers),
            "blobs": sum(t.get("blobs_checked", 0) for t in tiers),
            "problems": [p for t in tiers for p in t.get("problems", [])][:5]}
