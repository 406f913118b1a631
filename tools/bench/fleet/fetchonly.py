"""``python -m tools.bench.fleet --fetch-only``: storms of fetch-only clients (:mod:`tools.bench.fleet.client`),
many per process.

For each target (one ``redis-server``; with ``--cluster`` a Redis Cluster of 3 masters with a replica each), started
once and seeded with both artifact sets (:mod:`tools.bench.fleet.artifacts`), and each set (``cpu``, ``gpu``):

- the **lone** client: one process, one client, ``--lone-repeat`` times; the median of its seconds;
- a **storm** per N of ``--workers``: N clients over ``min(N, --procs)`` processes, released at once; the nodes
  sampled from GO until every client is done (:class:`tools.bench.fleet.targets.Sampler`: bytes served, peak
  connections above the count before GO, CPU seconds), while every client keeps its cache open.

Beside p99 over the lone client, each storm shows its CPU floor: the CPU seconds of all its clients and of Redis
over the host's cores, the least time the storm could take on this host however the cache behaved.  A fleet's
workers run on hosts of their own; here every client shares the same cores, so p99 over the lone client measures
this host as much as the cache, and p99 over the floor says how much of the wait the host's CPU does not explain.

The clients' URL is the target's with ``read_only=1`` (a serving worker's, docs/fleet.md) and, on the cluster,
``replica_reads`` as ``--replica-reads`` says; the artifacts are signed and the clients verify the signatures
(``PRECOMPILE_VERIFY_KEYS``), unless ``--no-sign``.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tools.bench.fleet import artifacts
from tools.bench.fleet.client import BUILDS
from tools.bench.fleet.storm import ROOT, mem_available, percentile, worker_env
from tools.bench.fleet.targets import Sampler, Target

log = logging.getLogger("bench_fleet")


def client_env(work: Path, verify_key: str | None) -> dict[str, str]:
    env = worker_env(work / "client-env")
    env.pop("PRECOMPILE_SIGNING_KEY", None)
    if verify_key:
        env["PRECOMPILE_VERIFY_KEYS"] = verify_key
    else:
        env.pop("PRECOMPILE_VERIFY_KEYS", None)
    return env


def prepare(a, work: Path) -> tuple[dict[str, list[artifacts.Entry]], Path, str | None]:
    """``({set name: entries}, signing key path, its public text or None with --no-sign)``."""
    from precompile.manifest.trust_keys import generate_key

    sets: dict[str, list[artifacts.Entry]] = {}
    names = [s for s in a.artifacts.split(",") if s]
    seed_url = a.seed_cache
    if seed_url is None:
        log.info("building the %d CPU artifacts (precompile.standalone_compile, one process)", a.keys)
        seed_url = artifacts.build(work / "seed", a.keys, worker_env(work / "build-env"))
    cpu = artifacts.read_set(seed_url, a.keys)
    if "cpu" in names:
        sets["cpu"] = cpu
    if "gpu" in names:
        sets["gpu"] = artifacts.gpu_size(cpu, a.gpu_mb)
    key = work / "signing.pem"
    public = generate_key(key) if not key.exists() else None
    if public is None:
        from precompile.manifest.trust_keys import load_signing_key, public_text

        public = public_text(load_signing_key(str(key)).public_key())
    return sets, key, (None if a.no_sign else public)


def run_storm(target: Target, url: str, n: int, keys: list[str], base: Path, label: str, *, procs: int,
              env: dict[str, str], timeout: float) -> dict:
    """``n`` clients over ``min(n, procs)`` processes released at once; the storm's summary (:func:`summarize`)."""
    base.mkdir(parents=True)
    p = min(n, procs)
    share = [n // p + (i < n % p) for i in range(p)]
    running, first = [], 0
    for i, count in enumerate(share):
        cmd = [sys.executable, "-m", "tools.bench.fleet.client", "--url", url, "--keys", ",".join(keys), "--clients",
               str(count), "--first", str(first), "--ready", str(base / "ready"), "--go", str(base / "GO"),
               "--done", str(base / "done"), "--stop", str(base / "STOP"), "--out", str(base / f"p{i}.json"),
               "--timeout", str(timeout)]
        err = open(base / f"p{i}.err", "w")
        running.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err), err))
        first += count
    aborted = ""
    try:
        _wait_count(running, base / "ready", label, "ready", timeout)
        target.refresh_roles()
        with Sampler(target.live()) as sampler:
            go_at = time.time()
            (base / "GO.tmp").write_text(repr(go_at))
            os.replace(base / "GO.tmp", base / "GO")
            try:
                _wait_count(running, base / "done", label, "done", timeout)
            except StormAborted as err:
                aborted = str(err)
                log.warning("%s: %s", label, aborted)
            wall = time.time() - go_at
        (base / "STOP").write_text("stop")
        for proc, _ in running:
            if aborted:
                proc.kill()
            proc.wait(timeout=60)
    finally:
        for proc, err in running:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            err.close()
    docs = []
    for i, (proc, _) in enumerate(running):
        out = base / f"p{i}.json"
        if aborted and not out.exists():
            continue
        if not out.exists():
            raise SystemExit(f"{label}: client process {i} exited with {proc.returncode}:\n"
                             f"{(base / f'p{i}.err').read_text()[-3000:]}")
        docs.append(json.loads(out.read_text()))
    return {**summarize(docs, sampler.deltas(), n, len(keys), label, wall), "aborted": aborted}


class StormAborted(Exception):
    """The host ran short of memory during a storm: its clients were stopped."""


#: A storm is stopped when the host's ``MemAvailable`` falls below this (other work shares the machine).
MEM_RESERVE = 1 << 30


def _wait_count(running, folder: Path, label: str, what: str, timeout: float) -> None:
    deadline, shown, checked = time.monotonic() + timeout, time.monotonic(), 0.0
    while True:
        count = len(list(folder.iterdir())) if folder.exists() else 0
        if count == len(running):
            return
        if time.monotonic() - checked > 0.5:
            checked = time.monotonic()
            if mem_available() < MEM_RESERVE:
                raise StormAborted(f"stopped: MemAvailable fell below {MEM_RESERVE >> 20} MiB with {count}/"
                                   f"{len(running)} client processes {what}; try fewer clients")
        dead = [i for i, (p, _) in enumerate(running) if p.poll() is not None]
        if dead and what == "ready":
            raise SystemExit(f"{label}: client process {dead[0]} exited before GO")
        if time.monotonic() > deadline:
            raise SystemExit(f"{label}: {count}/{len(running)} client processes {what} after {timeout:.0f} s")
        if time.monotonic() - shown > 5:
            log.info("%s: %d/%d client processes %s", label, count, len(running), what)
            shown = time.monotonic()
        time.sleep(0.01)


def summarize(docs: list[dict], nodes: dict[int, dict], n: int, keys: int, label: str, wall: float) -> dict:
    """Per client seconds (p50, p99 by nearest rank, max), outcomes, builds, errors, timeouts, breakers; per node
    bytes served, peak connections and CPU seconds."""
    clients = [c for d in docs for c in d["clients"]]
    seconds = [c["seconds"] for c in clients if "seconds" in c]
    outcomes: dict[str, int] = {}
    for c in clients:
        for k, v in c["outcomes"].items():
            outcomes[k] = outcomes.get(k, 0) + v
    served = sum(d["served_bytes"] for d in nodes.values())
    cpu = sum(d["cpu_s"] for d in nodes.values())
    errors = [e for c in clients for e in c["errors"]]
    return {"label": label, "workers": n, "keys": keys, "wall_s": wall, "clients_reported": len(clients),
            "p50": statistics.median(seconds) if seconds else None,
            "p99": percentile(seconds, 99) if seconds else None, "max": max(seconds, default=None),
            "open_p50": statistics.median([c["open_s"] for c in clients if "open_s" in c] or [0.0]),
            "outcomes": outcomes, "builds": sum(outcomes.get(o, 0) for o in BUILDS),
            "errors": outcomes.get("error", 0) + sum(d["unfinished"] for d in docs) + (n - len(clients)),
            "error_samples": errors[:5], "timeouts": sum(c["timeouts"] for c in clients),
            "breakers_tripped": sum(len(d["breakers_tripped"]) for d in docs),
            "verified_bytes": sum(c["bytes"] for c in clients),
            "client_cpu_s": sum(d["cpu_s"] for d in docs), "client_rss_mib": sum(d["rss_mib"] for d in docs),
            "nodes": {str(port): d for port, d in nodes.items()}, "served_bytes": served,
            "peak_connections": sum(d["peak_clients"] for d in nodes.values()),
            "peak_connections_per_node": max((d["peak_clients"] for d in nodes.values()), default=0),
            "redis_cpu_s": cpu, "redis_cpu_s_per_gb": cpu / (served / 1e9) if served else None,
            # the least the storm can take on this host: all its CPU (clients and Redis) spread over every core
            "cpu_floor_s": (sum(d["cpu_s"] for d in docs) + cpu) / (os.cpu_count() or 1)}


def run(a, work: Path, replica_reads: bool, sizes: list[int]) -> dict:
    """Every target, artifact set and N of one ``--fetch-only`` run; the result for the tables and JSON line."""
    from tools.bench.fleet.targets import start_cluster, start_single

    sets, key, public = prepare(a, work)
    env = client_env(work, public)
    subprocess.run([sys.executable, "-c", "import tools.bench.fleet.client, cache_backends.redis.cache, "
                    "precompile.manifest.manifest, precompile.manifest.names, precompile.manifest.trust"],
                   cwd=ROOT, env=env, check=True)  # .pyc files written once, before any client starts
    result: dict = {"mode": "fetch-only", "storms": [], "lone": {}, "cpus": os.cpu_count(), "procs": a.procs,
                    "replica_reads": replica_reads, "signed": public is not None, "keys": a.keys,
                    "sets": {name: _describe(entries) for name, entries in sets.items()}}
    kinds = ([] if a.no_single else ["redis"]) + (["cluster"] if a.cluster else [])
    seq = 0
    for kind in kinds:
        target = start_cluster(work / kind) if kind == "cluster" else start_single(work / kind)
        try:
            if kind == "cluster":
                target.options["replica_reads"] = int(replica_reads)
            for name, entries in sets.items():  # what one client verifies: the signed manifests and the load blobs
                result["sets"][name]["read_bytes"] = artifacts.store(target.url(), entries, key)
            url = target.url(read_only=1)
            for name, entries in sets.items():
                keys = [e.key for e in entries]
                lone = []
                for _ in range(a.lone_repeat):
                    seq += 1
                    lone.append(run_storm(target, url, 1, keys, work / f"s{seq}", f"{kind} {name} lone", procs=1,
                                          env=env, timeout=a.timeout))
                result["lone"][f"{kind}/{name}"] = {"seconds": statistics.median(s["p50"] for s in lone),
                                                    "runs": [s["p50"] for s in lone],
                                                    "errors": sum(s["errors"] for s in lone)}
                log.info("%s %s lone client: %.3f s (median of %s)", kind, name,
                         result["lone"][f"{kind}/{name}"]["seconds"], ", ".join(f"{s['p50']:.3f}" for s in lone))
                for n in sizes:
                    seq += 1
                    s = run_storm(target, url, n, keys, work / f"s{seq}", f"{kind} {name} N={n}", procs=a.procs,
                                  env=env, timeout=a.timeout)
                    s.update(target=kind, artifacts=name, node_names=target.node_names(),
                             serving=target.serving(replica_reads))
                    log.info("%s: p50 %.3f p99 %.3f s, %d errors, %d builds, %.1f MB served, peak %d connections "
                             "a node, wall %.1f s", s["label"], s["p50"] or -1, s["p99"] or -1, s["errors"],
                             s["builds"], s["served_bytes"] / 1e6, s["peak_connections_per_node"], s["wall_s"])
                    result["storms"].append(s)
        finally:
            target.close()
    return result


def _describe(entries: list[artifacts.Entry]) -> dict:
    """A set's artifacts and blobs a load reads, and the bytes one worker reads as stored (manifests and load blobs,
    zstd; ``read_bytes``, uncompressed, is set once the set is stored and signed)."""
    load = [e.blobs[d] for e in entries for d in e.load_digests()]
    manifests = [json.dumps(e.doc).encode() for e in entries]
    return {"artifacts": len(entries), "load_blobs": len(load),
            "stored_bytes": sum(map(artifacts.stored_bytes, load + manifests))}
