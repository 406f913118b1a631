#!/usr/bin/env python
"""The storm: N cold workers at once on Redis and on a Redis Cluster with replicas, measured, with faults.

For each target (one ``redis-server``; with ``--cluster`` also a Redis Cluster of 3 masters with one replica each,
``cluster-node-timeout`` 1000 ms), each started by this tool on loopback ports without persistence, and each N of
``--workers``, on a fresh target:

- **cold** storm: N workers (:mod:`tools.bench.fleet.worker`: ``precompile.standalone_compile(graph, inputs,
  cache=URL)`` and one call, for ``--keys`` small MLP graphs, in rotated order) released at once on an empty
  cache: one build per key (a build lease), every other worker waits and loads;
- the **lone** anchor (first N only): one worker alone on the stored cache, ``--lone-repeat`` times, median;
- **warm** storm: N workers, every one loads;
- with ``--tiered``, a **tiered** warm storm: every worker's URL is ``file://NEAR|redis://...`` with one NEAR
  directory for all (one host), empty at start: the bytes Redis served are the host's download.

Per storm: builds (outcomes ``built`` + ``takeover``), seconds from GO to a worker's first output of every key
(p50, p99 by nearest rank, max; imports, graphs and eager outputs are done before GO), per Redis node the bytes it
served to clients during the storm (``INFO stats`` ``total_net_output_bytes`` less replication and less the
sampler's own INFO replies), peak ``connected_clients`` above the node's count before GO (sampled every 0.1 s)
and CPU seconds (``used_cpu_sys + used_cpu_user``); outputs compared with eager by every worker (``allclose``,
rtol 1e-4, atol 1e-5).  ``max_node_share`` = the largest node's bytes / (all bytes / the nodes that serve reads:
the masters, and the replicas too when the URL has ``replica_reads=1``, used when the installed backend accepts it).

With ``--faults`` (or ``--fault NAME,...``), on a fresh target (the cluster with ``--cluster``) seeded from a bundle
of the cold storm's artifacts, a storm of ``--fault-workers`` (default: the smallest N) per fault
(:mod:`tools.bench.fleet.faults`: kill-master, kill-builder, oom, stop-node); after each, ``precompile verify``.

With ``--fetch-only`` (:mod:`tools.bench.fleet.fetchonly`), no worker imports torch or loads anything: storms of
fetch-only clients (:mod:`tools.bench.fleet.client`), many per process, each reading and verifying what a worker's load
reads (refs, signed manifests, blobs), on one redis-server and (``--cluster``) the cluster, per artifact set
(``--artifacts``: the real CPU builds, and GPU-size ones of ``--gpu-mb`` MB a worker made from them) and per N
(default 16, 64, 256, 1024), beside a lone client; per N: p50/p99 seconds and p99 over the lone client, peak
connections per node, bytes per node and ``max_node_share``, Redis CPU seconds per GB served, errors, timeouts,
breaker trips and builds.

The workers' imports are warmed once with ``PYTHONDONTWRITEBYTECODE`` unset, and the workers run with it unset
(this workplace sets it, which would make every worker compile its imports' source).  An N whose workers would
not fit in ``MemAvailable`` (the lone worker's peak RSS x N x 1.3) is skipped and says so.  Progress goes to
stderr; tables to stdout; with ``--json`` the last line is one JSON object (``--json-out``: everything).

    python -m tools.bench.fleet --workers 4 --keys 2                       # quick
    python -m tools.bench.fleet --workers 16,64 --cluster --faults --tiered --json
    python -m tools.bench.fleet --fetch-only --cluster --json                # 16..1024 fetch-only clients
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
if __name__ == "__main__":  # run by path: the repository root in place of this folder (tools/__init__.py)
    sys.path[0] = str(REPO)

from tools.bench.fleet import faults as fleet_faults  # noqa: E402
from tools.bench.fleet.report import print_tables, summary_line  # noqa: E402
from tools.bench.fleet.storm import mem_available, run_storm, warm_bytecode  # noqa: E402
from tools.bench.fleet.targets import Target, start_cluster, start_single  # noqa: E402

log = logging.getLogger("bench_fleet")


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.bench.fleet", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default=None, help="fleet sizes, comma-separated (default 16,64; fetch-only "
                   "16,64,256,1024)")
    p.add_argument("--keys", type=int, default=4, help="graphs (artifact keys) every worker gets")
    p.add_argument("--cluster", action="store_true", help="also a Redis Cluster of 3 masters with 1 replica each")
    p.add_argument("--no-single", action="store_true", help="skip the single redis-server target")
    p.add_argument("--tiered", action="store_true", help="also a warm storm behind one shared near directory")
    p.add_argument("--faults", action="store_true", help="run the faults " + ", ".join(fleet_faults.DEFAULT_FAULTS))
    p.add_argument("--fault", default="", help="run these faults (comma-separated)")
    p.add_argument("--fault-workers", type=int, default=None, help="workers of a fault's storm (default: smallest N)")
    p.add_argument("--replica-reads", choices=("auto", "on", "off"), default="auto",
                   help="replica_reads=1 in the cluster URL: when the backend accepts it (auto), always, never")
    p.add_argument("--lone-repeat", type=int, default=3)
    p.add_argument("--timeout", type=float, default=900, help="seconds a storm may take after GO")
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    p.add_argument("--json-out", default=None, help="write every storm's details here")
    p.add_argument("--workdir", default=None, help="keep worker dirs and logs here (default: a temp dir, removed)")
    f = p.add_argument_group("fetch-only storms (tools/bench/fleet/fetchonly.py)")
    f.add_argument("--fetch-only", action="store_true", help="clients that fetch and verify, no torch, no load")
    f.add_argument("--artifacts", default="cpu,gpu", help="artifact sets: cpu (real builds), gpu (GPU-size)")
    f.add_argument("--gpu-mb", type=float, default=13.0, help="MB a worker reads of the gpu set, as stored")
    f.add_argument("--seed-cache", default=None, help="read the cpu set from this cache (default: build it)")
    f.add_argument("--procs", type=int, default=max(2, os.cpu_count() or 2), help="client processes a storm")
    f.add_argument("--no-sign", action="store_true", help="store unsigned artifacts; clients check no signature")
    return p.parse_args(argv)


def _replica_reads(mode: str) -> tuple[bool, bool]:
    """``(replica reads on, the URL option exists)``."""
    from cache_backends.redis.url import URL_OPTIONS

    accepted = "replica_reads" in URL_OPTIONS
    if mode == "on" and not accepted:
        raise SystemExit("--replica-reads on: the installed cache_backends has no replica_reads URL option")
    if mode == "auto" and not accepted:
        log.warning("the installed cache_backends has no replica_reads option: the cluster is measured without it")
    return (accepted if mode == "auto" else mode == "on"), accepted


class Bench:
    """One run of the tool: targets started and closed, storms run, everything measured kept in ``result``."""

    def __init__(self, a: argparse.Namespace, work: Path):
        self.a, self.work = a, work
        self.keys: dict[int, str] = {}  # key index -> artifact key, from the first cold storm
        self.replica_reads, self.replica_reads_option = _replica_reads(a.replica_reads) if a.cluster else (False, False)
        self.result: dict = {"storms": [], "faults": [], "skipped": [], "lone": {}, "keys": a.keys,
                             "cpus": os.cpu_count(), "replica_reads": self.replica_reads}
        self.seq = 0
        self.rss_mib: float | None = None
        self.bundle: dict[tuple, Path | None] = {}  # keys left out -> bundle file (None: nothing to import)

    def start(self, kind: str) -> Target:
        self.seq += 1
        d = self.work / f"{kind}-{self.seq}"
        target = start_cluster(d) if kind == "cluster" else start_single(d)
        if kind == "cluster" and self.replica_reads_option:
            target.options["replica_reads"] = int(self.replica_reads)
        return target

    def storm(self, target: Target, n: int, storm: str, url: str | None = None, **kw) -> dict:
        self.seq += 1
        label = f"{target.kind} N={n} {storm}"
        s = run_storm(target, url or target.url(), n, self.a.keys, self.work / f"s{self.seq}-{storm}", label,
                      timeout=self.a.timeout, **kw)
        s.update(target=target.kind, storm=storm, node_names=target.node_names(),
                 serving=target.serving(self.replica_reads))
        log.info("%s: builds %d, outcomes %s, ttfo p50 %.2f p99 %.2f s, served %d bytes, wrong %d, crashed %d",
                 label, s["builds"], s["outcomes"], s["ttfo_p50"] or -1, s["ttfo_p99"] or -1, s["served_bytes"],
                 s["wrong_outputs"], len(s["crashed"]))
        return s

    def fits(self, n: int) -> bool:
        if self.rss_mib is None:
            return True
        need, have = n * self.rss_mib * 1.3 * 2**20, mem_available()
        if need > have:
            log.warning("N=%d skipped: %d workers need about %.1f GiB (peak RSS %.0f MiB each, +30%%), %.1f GiB "
                        "available", n, n, need / 2**30, self.rss_mib, have / 2**30)
            self.result["skipped"].append({"workers": n, "need_gib": need / 2**30, "available_gib": have / 2**30})
            return False
        return True

    def target_run(self, kind: str, sizes: list[int]) -> None:
        for n in sizes:
            if not self.fits(n):
                continue
            target = self.start(kind)
            try:
                cold = self.storm(target, n, "cold")
                self.result["storms"].append(cold)
                self.keys = dict(cold["artifact_keys"])
                if kind not in self.result["lone"]:
                    self.lone(target)
                    self.make_bundles(target)
                self.result["storms"].append(self.storm(target, n, "warm"))
                if self.a.tiered:
                    near = self.work / f"near-{self.seq}"
                    tiered = self.storm(target, n, "tiered", url=f"file://{near}|{target.url()}")
                    tiered["near_counters"] = _near_counters(near)
                    self.result["storms"].append(tiered)
            finally:
                target.close()

    def lone(self, target: Target) -> None:
        runs = [self.storm(target, 1, "lone") for _ in range(self.a.lone_repeat)]
        self.result["storms"] += runs
        self.rss_mib = max(r["worker_rss_mib"] for r in runs)
        self.result["lone"][target.kind] = {"ttfo_s": statistics.median(r["ttfo_p50"] for r in runs),
                                            "runs": [r["ttfo_p50"] for r in runs], "rss_mib": self.rss_mib}
        log.info("lone worker on %s: %.3f s to first output (median of %s)", target.kind,
                 self.result["lone"][target.kind]["ttfo_s"], ", ".join(f"{r['ttfo_p50']:.3f}" for r in runs))

    def make_bundles(self, target: Target) -> None:
        """Bundles of every key and of every key but key 0, for seeding the faults' targets."""
        if self.bundle:
            return
        for left_out in ((), (0,)):
            path = self.work / f"bundle-{'-'.join(map(str, left_out)) or 'all'}.pc"
            keys = [key for k, key in sorted(self.keys.items()) if k not in left_out]
            if keys:  # with one key, "every key but key 0" is an empty cache
                fleet_faults.cli("export", "--cache", target.url(), "-o", str(path), *keys, env_dir=self.work / "cli")
            self.bundle[left_out] = path if keys else None

    def fault_run(self, kind: str, names: list[str], n: int) -> None:
        for name in names:
            if kind != "cluster" and name in ("kill-master", "kill-seed"):
                log.warning("fault %s skipped: a single redis-server has no replica to promote (use --cluster)", name)
                continue
            factory, left_out, options, undo = fleet_faults.FAULTS[name]
            warm = [s for s in self.result["storms"] if s["target"] == kind and s["storm"] == "warm"]
            delay = 0.25 * (warm[0]["ttfo_p50"] if warm else 1.0)
            target = self.start(kind)
            try:
                if self.bundle[left_out] is not None:
                    fleet_faults.cli("import", str(self.bundle[left_out]), "--cache", target.url(),
                                     env_dir=self.work / "cli")
                url = target.url(**options)
                s = self.storm(target, n, f"fault {name}", url=url, fault=factory(delay))
                if undo is not None:
                    undo(target)
                target.wait_ok()
                s["verify"] = fleet_faults.verify(target.url(), self.work / "cli")
                s["fault_name"] = name
                s["survived"] = not s["crashed"] and s["wrong_outputs"] == 0 and s["verify"]["ok"] and \
                    s["survivors"] + s["killed"] == n
                log.info("fault %s: %s; builds %d (%s); verify %s", name, "survived" if s["survived"] else "NOT "
                         "survived", s["builds"], s["outcomes"], "ok" if s["verify"]["ok"] else s["verify"])
                self.result["faults"].append(s)
            finally:
                target.close()


def _near_counters(near: Path) -> dict:
    """The near tier's own counters after a tiered storm (``near_waits``, ``remote_blobs``, ``remote_bytes`` where
    the backend counts them)."""
    from cache_backends import open_cache

    counters = open_cache(f"file://{near}").counters()
    return {k: v for k, v in counters.items() if k.startswith(("near_", "remote_"))}


def _fetch_only(a: argparse.Namespace, argv) -> int:
    from tools.bench.fleet.fetchonly import run
    from tools.bench.fleet.report import fetch_summary_line, print_fetch_tables

    sizes = sorted(int(s) for s in (a.workers or "16,64,256,1024").split(","))
    replica_reads = _replica_reads(a.replica_reads)[0] if a.cluster else False
    work = Path(a.workdir or tempfile.mkdtemp(prefix="bench-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    started, load0 = time.time(), os.getloadavg()[0]
    try:
        result = run(a, work, replica_reads, sizes)
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    result.update(command=" ".join(["python", "-m", "tools.bench.fleet", *(argv or sys.argv[1:])]),
                  loadavg_start=load0, loadavg_end=os.getloadavg()[0], seconds=time.time() - started)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(result, indent=1) + "\n")
    print_fetch_tables(result)
    if a.json:
        print(json.dumps(fetch_summary_line(result)))
    return 0


def main(argv=None) -> int:
    a = _args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stderr)
    if a.fetch_only:
        if a.faults or a.fault or a.tiered:
            raise SystemExit("--fetch-only runs no faults and no tiered storm; run those without it")
        return _fetch_only(a, argv)
    sizes = sorted(int(s) for s in (a.workers or "16,64").split(","))
    names = list(fleet_faults.DEFAULT_FAULTS) if a.faults else []
    names += [f for f in a.fault.split(",") if f and f not in names]
    unknown = set(names) - set(fleet_faults.FAULTS)
    if unknown:
        raise SystemExit(f"unknown faults {sorted(unknown)}; known: {', '.join(fleet_faults.FAULTS)}")
    work = Path(a.workdir or tempfile.mkdtemp(prefix="bench-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    bench = Bench(a, work)
    bench.result.update(command=" ".join(["python", "-m", "tools.bench.fleet", *(argv or sys.argv[1:])]),
                        loadavg_start=os.getloadavg()[0], mem_available_gib=mem_available() / 2**30)
    try:
        log.info("warming bytecode (PYTHONDONTWRITEBYTECODE unset for this and every worker)")
        warm_bytecode(work)
        kinds = ([] if a.no_single else ["redis"]) + (["cluster"] if a.cluster else [])
        for kind in kinds:
            bench.target_run(kind, sizes)
        if names:
            bench.fault_run("cluster" if a.cluster else "redis", names, a.fault_workers or sizes[0])
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    bench.result.update(loadavg_end=os.getloadavg()[0], seconds=time.time() - started)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(bench.result, indent=1) + "\n")
    print_tables(bench.result)
    if a.json:
        print(json.dumps(summary_line(bench.result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
