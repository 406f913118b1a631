#!/usr/bin/env python
"""What a squatter costs a worker (issue 34, "Stalls"): each case timed against its honest twin, in fresh processes.

- ``stats``: a cache hit (``standalone_compile`` of a stored graph, local cache) while another user (``nobody``, by
  ``setpriv`` when run as root) holds ``flock`` on ``locks/stats.lock`` with read access only, against an unheld hit;
- ``fetch``: a near miss of a tiered cache (``file://DIR|redis://``: the artifact's blobs fetched from Redis) while
  that user holds every fetch lock of ``DIR``, against an unheld near miss;
- ``lease``: a miss whose key carries a planted lease (a string with a ten-year expiry), against an unplanted miss;
- ``refused``: a worker with verify keys waiting 30 s for a key whose lease a live builder renews and whose ref names
  an unsigned 16 MiB width-bomb manifest: its CPU seconds and peak resident growth (``resource.getrusage``);
- ``nohost``: a ``PRECOMPILE_REQUIRE_NO_HOST_CODE`` load of an entry whose manifest records a 2 GiB wrapper graph and a
  1 GiB host-code part, against the honest entry: peak resident growth (``getrusage``);
- ``cluster``: opening a Redis Cluster cache (3 masters, a replica each) whose masters are stopped (SIGSTOP), in a
  process that saw the cluster before, at ``timeout=2`` and the default.

    python tools/bench/squatting.py                 # every case, one JSON line each
    python tools/bench/squatting.py stats fetch     # some

Needs redis-server (and root for the ``nobody`` holder; otherwise the holder is this user). Run from the repository
root; ``tests/`` is used for its real-server helpers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run by path: the repository root in place of this folder (tools/__init__.py)
    sys.path[0] = str(REPO)

from tools._common import ChildFailed, run_child  # noqa: E402 - after the repository root is on the path

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
       "PYTHONWARNINGS": "ignore"}

PRELUDE = """
import json, os, resource, sys, time, torch, precompile
from cache_backends import open_cache

from torch.fx.experimental.proxy_tensor import make_fx

def mlp(x, w1, b1, w2, b2):
    return torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, w1, b1)), w2, b2)

torch.manual_seed(0)
inputs = [torch.randn(8, 64), torch.randn(256, 64), torch.randn(256), torch.randn(64, 256), torch.randn(64)]
gm = make_fx(mlp)(*inputs)

def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value
"""


def child(code: str, *args: str, env: dict[str, str] | None = None) -> dict:
    """Run ``PRELUDE + code`` in a fresh process; its last stdout line, parsed."""
    try:
        return run_child([sys.executable, "-c", PRELUDE + code, *args], f"the {code.split(chr(10))[1][:40]!r} child",
                         env={**ENV, **(env or {})}, timeout=900)
    except ChildFailed as err:
        raise RuntimeError(f"{err}:\n{err.stderr[-3000:]}") from None


def as_other_user(cmd: list[str]) -> list[str]:
    """``cmd`` run as ``nobody`` when this is root (a user with read access only), else as is."""
    if os.geteuid() == 0 and shutil.which("setpriv"):
        return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *cmd]
    return cmd


HOLD = """
import fcntl, os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
fds = [os.open(p, os.O_RDONLY) for p in sys.argv[1:]]  # read access only
for fd in fds:
    fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


def hold(paths: list[Path]) -> subprocess.Popen:
    """A process of another user holding ``flock`` on ``paths`` (opened read-only) until its stdin closes."""
    proc = subprocess.Popen(as_other_user([sys.executable, "-c", HOLD, *map(str, paths)]), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


HITS = """
url, n = sys.argv[1], int(sys.argv[2])
precompile.standalone_compile(gm, inputs, cache=url)  # stored (or a hit already)
print("ready", flush=True) if len(sys.argv) > 3 else None
times = [timed(lambda: precompile.standalone_compile(gm, inputs, cache=url))[0] for _ in range(n)]
print(json.dumps({"hit_s": sorted(times)[len(times) // 2], "source": precompile.standalone_compile(gm, inputs, cache=url).source}))
"""


def case_stats(work: Path) -> dict:
    url = f"file://{work / 'cache'}"
    unheld = child(HITS, url, "5")
    holder = hold([work / "cache" / "locks" / "stats.lock"])
    try:
        held = child(HITS, url, "3")
    finally:
        holder.kill()
    return {"case": "stats", "unheld_hit_s": unheld["hit_s"], "held_hit_s": held["hit_s"],
            "ratio": held["hit_s"] / unheld["hit_s"]}


NEAR_MISS = """
import shutil
url, near = sys.argv[1], sys.argv[2]
digests = list(precompile.standalone_compile(gm, inputs, cache=url.split("|")[1]).manifest.blobs)
out = []
for _ in range(3):
    shutil.rmtree(os.path.join(near, "blob"), ignore_errors=True)  # every blob a near miss again
    out.append(timed(lambda: open_cache(url).get_blobs(digests))[0])
print(json.dumps({"near_miss_s": sorted(out)[1], "blobs": len(digests)}))
"""


def case_fetch(work: Path, redis_url: str) -> dict:
    near = work / "near"
    url = f"file://{near}|{redis_url}"
    unheld = child(NEAR_MISS, url, str(near))
    locks = [near / "locks" / "fetch" / f"{i:03x}.lock" for i in range(4096)]
    for p in locks:
        p.touch()
    holder = hold(locks)
    try:
        held = child(NEAR_MISS, url, str(near))
    finally:
        holder.kill()
    return {"case": "fetch", "blobs": unheld["blobs"], "unheld_near_miss_s": unheld["near_miss_s"],
            "held_near_miss_s": held["near_miss_s"], "more_s": held["near_miss_s"] - unheld["near_miss_s"]}


LEASE = """
import redis
url, plant = sys.argv[1], sys.argv[2] == "1"
r = redis.Redis.from_url(url.split("?")[0])
r.flushall()
key = precompile.standalone_compile(gm, inputs).key  # the key (compiled without the cache)
if plant:
    r.set(open_cache(url)._lease_key(key), "held by hand", ex=10 * 365 * 86400)
seconds, got = timed(lambda: precompile.standalone_compile(gm, inputs, cache=url))
print(json.dumps({"miss_s": seconds, "outcome": got.outcome}))
"""


def case_lease(work: Path, redis_url: str) -> dict:
    url = redis_url + "?wait=60"  # an old worker waits this long for a planted lease
    plain, planted = child(LEASE, url, "0"), child(LEASE, url, "1")
    return {"case": "lease", "unplanted_miss_s": plain["miss_s"], "planted_miss_s": planted["miss_s"],
            "wait_s": 60, "outcome": planted["outcome"]}


REFUSED = """
import redis, threading
from precompile.store.cache_io import load_from_cache
from precompile.store.coordination import get_or_build
url, key = sys.argv[1], "3c" * 32
c = open_cache(url)
n = (16 << 20) // 2 - 64  # "0," per item: a 16 MiB manifest, the bound
c.set_ref(key, c.put_blob(json.dumps({"schema": 2, "key": key, "blobs": [0] * n}, separators=(",", ":")).encode()))
r, stop = redis.Redis.from_url(url.split("?")[0]), threading.Event()

def builder():  # a live builder renewing its lease
    while not stop.is_set():
        r.set(c._lease_key(key), "0f" * 16, px=3000)
        stop.wait(1)

threading.Thread(target=builder, daemon=True).start()
cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
rss, cpu0, polls = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, cpu(), []
get_or_build(c, key, lambda: polls.append(1) or load_from_cache(key, c), lambda: "built", wait_s=30)
stop.set()
print(json.dumps({"polls": len(polls), "cpu_s": cpu() - cpu0,
                  "peak_growth_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024}))
"""


def case_refused(work: Path, redis_url: str) -> dict:
    from precompile.manifest import trust

    work.mkdir(parents=True)
    env = {"PRECOMPILE_VERIFY_KEYS": trust.generate_key(work / "builder.pem")}
    return {"case": "refused", "wait_s": 30, **child(REFUSED, redis_url, env=env)}


GRAPH_ENTRY = """
from precompile.manifest.wrapper import graph as wg
from precompile.inductor.build.fx_wrapper import wrapper_graph
from cache_backends.base import digest_bytes
from precompile.key.graph import canonical_json
url = sys.argv[1]

class Gemms(torch.nn.Module):
    def forward(self, a, b, c):
        return torch.mm(a, b), torch.addmm(c, a, b)

g = torch.fx.symbolic_trace(Gemms())
example = [torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)]
art = precompile.standalone_compile(g, example, cache=url)
data = json.dumps(wg.to_data(wrapper_graph(g, example)[0])).encode()
c = open_cache(url)
m = json.loads(c.get_blob(c.get_ref(art.key)))
m["parts"]["wrapper_graph"] = {"graph": c.put_blob(data), "kernels": {}}
m["blobs"][digest_bytes(data)] = {"size": len(data), "role": "wrapper graph (data)"}
c.set_ref(art.key, c.put_blob(json.dumps(m, sort_keys=True).encode()))
print(json.dumps({"key": art.key, "graph": digest_bytes(data), "host": precompile.Manifest.from_dict(m).load_digests()[0]}))
"""

GRAPH_LOAD = """
from precompile.store.cache_io import load_from_cache
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
seconds, art = timed(lambda: load_from_cache(sys.argv[1], sys.argv[2]))
print(json.dumps({"found": art is not None, "s": seconds,
                  "peak_growth_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024}))
"""


def zstd_zeros(n: int) -> bytes:
    import zstandard

    comp, step, out = zstandard.ZstdCompressor().compressobj(), b"\0" * (1 << 20), []
    for _ in range(n >> 20):
        out.append(comp.compress(step))
    return b"".join(out) + comp.flush()


def case_nohost(work: Path) -> dict:
    from cache_backends.local.cache import LocalCache

    honest, inflated = work / "honest", work / "inflated"
    entry = child(GRAPH_ENTRY, f"file://{honest}")
    shutil.copytree(honest, inflated)
    cache = LocalCache(inflated)
    m = json.loads(cache.get_blob(cache.get_ref(entry["key"])))
    for digest, size in ((entry["graph"], 2 << 30), (entry["host"], 1 << 30)):
        m["blobs"][digest]["size"] = size
        (inflated / "blob" / digest[:2] / digest[2:]).write_bytes(zstd_zeros(size))
    cache.set_ref(entry["key"], cache.put_blob(json.dumps(m, sort_keys=True).encode()))
    env = {"PRECOMPILE_REQUIRE_NO_HOST_CODE": "1"}
    a, b = (child(GRAPH_LOAD, entry["key"], f"file://{d}", env=env) for d in (honest, inflated))
    return {"case": "nohost", "honest": a, "inflated": b, "more_mb": b["peak_growth_mb"] - a["peak_growth_mb"]}


CLUSTER_OPEN = """
from pathlib import Path
url, go = sys.argv[1], Path(sys.argv[2])
open_cache(url).get_ref("cd" * 32)  # this process has seen the cluster
print("ready", flush=True)
while not go.exists():
    time.sleep(0.02)
start = time.perf_counter()
try:
    open_cache(url).get_ref("cd" * 32)
    what = "opened"
except Exception as err:
    what = type(err).__name__
print(json.dumps({"open_s": time.perf_counter() - start, "outcome": what}))
"""


def case_cluster(work: Path) -> dict:
    from _redis import RedisCluster

    cluster = RedisCluster(work, replicas=1, node_timeout_ms=600_000).start()
    out = {"case": "cluster"}
    try:
        for timeout in (2, None):
            url = cluster.url(**({"timeout": timeout} if timeout else {}))
            go = work / f"go{timeout}"
            proc = subprocess.Popen([sys.executable, "-c", PRELUDE + CLUSTER_OPEN, url, str(go)], env=ENV,
                                    stdout=subprocess.PIPE, text=True)
            assert proc.stdout.readline().strip() == "ready"
            masters = cluster.masters_now()
            for n in masters:
                n.pause()
            go.touch()
            out[f"timeout_{timeout or 'default'}"] = json.loads(proc.communicate(timeout=600)[0].splitlines()[-1])
            for n in masters:
                n.resume()
    finally:
        cluster.stop()
    return out


def main(argv: list[str]) -> None:
    sys.path[:0] = [str(REPO / "tests")]
    from _redis import RedisServer

    runs = {"stats": lambda work, url: case_stats(work), "fetch": case_fetch, "lease": case_lease,
            "refused": case_refused, "nohost": lambda work, url: case_nohost(work),
            "cluster": lambda work, url: case_cluster(work)}
    cases = argv or list(runs)
    unknown = [name for name in cases if name not in runs]
    if unknown:
        raise SystemExit(f"tools/bench/squatting.py: no case {', '.join(unknown)}; cases: {' '.join(runs)} "
                         "(see the docstring)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        work.chmod(0o755)  # the other user reaches the lock files (they are 0644, as a cache makes them)
        server = RedisServer(work / "redis").start()
        try:
            for name in cases:
                print(json.dumps(runs[name](work / name, server.url())), flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
