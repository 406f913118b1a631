"""One compile per key across a fleet, with real worker processes and a real redis-server (tests/_fleet_worker.py).

- 8 workers start at the same moment on an empty Redis with the same graph: exactly one Inductor compile.
- ``kill -9`` of the builder while it holds the lease: a waiting worker takes over; no lease is left behind.
- Redis stopped (SIGSTOP, then SIGKILL) while workers load and build: every worker still returns right outputs.
- A byte flipped in a chunk stored in Redis: detected, dropped, rebuilt, counted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import TESTS, python_env

from cache_backends import open_cache
from precompile.manifest.manifest import Manifest

WORKER = str(TESTS / "_fleet_worker.py")


def start_workers(url: str, n: int, tmp: Path, width: int = 32, go: bool = True,
                  name: str = "w") -> tuple[list[subprocess.Popen], Path]:
    """Start ``n`` workers, wait until each is ready (torch imported, graph built), then (if ``go``) release them."""
    ready, go_file = tmp / f"{name}-ready", tmp / f"{name}-go"
    procs = [subprocess.Popen([sys.executable, WORKER, url, str(ready), str(go_file), str(width)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=python_env())
             for _ in range(n)]
    deadline = time.monotonic() + 180
    while not ready.exists() or len(list(ready.iterdir())) < n:
        dead = [p for p in procs if p.poll() is not None]
        assert not dead, f"a worker died before it was ready: {dead[0].communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, "workers not ready after 180 s"
        time.sleep(0.05)
    if go:
        go_file.touch()
    return procs, go_file


def results(procs: list[subprocess.Popen], timeout: float = 300) -> list[dict]:
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"worker exited with {p.returncode}:\n{stderr[-4000:]}"
        out.append(json.loads(stdout.strip().splitlines()[-1]) | {"stderr": stderr})
    return out


def test_eight_workers_at_once_compile_once(redis_server, tmp_path):
    url = redis_server.url()
    procs, _ = start_workers(url, 8, tmp_path)
    reports = results(procs)
    outcomes = sorted(r["outcome"] for r in reports)
    assert outcomes.count("built") == 1, outcomes
    assert set(outcomes) <= {"built", "waited", "hit"}, outcomes
    assert sum(r["compiles"] > 0 for r in reports) == 1, [r["compiles"] for r in reports]
    assert len({r["key"] for r in reports}) == 1
    assert all(r["max_diff"] < 1e-5 for r in reports), [r["max_diff"] for r in reports]
    counters = open_cache(url).counters()
    assert counters["builds"] == 1 and counters["waits"] + counters["hits"] == 7, counters
    assert counters["errors"] == 0 and counters["takeovers"] == 0, counters
    assert not redis_server.client().keys("precompile:lease:*"), "a lease was left behind"


def test_killed_builder_is_taken_over(redis_server, tmp_path):
    # a long lease, so that the second worker surely finds it held and waits for it to expire
    url = redis_server.url(lease_ttl=10)
    client = redis_server.client()
    (builder,), _ = start_workers(url, 1, tmp_path, name="builder")
    deadline = time.monotonic() + 120
    while not client.keys("precompile:lease:*"):
        assert builder.poll() is None, f"the builder finished before it was killed: {builder.communicate()}"
        assert time.monotonic() < deadline, "the builder never took the lease"
        time.sleep(0.01)
    os.kill(builder.pid, signal.SIGKILL)  # mid-compile, holding the lease
    builder.wait()
    (waiter,), _ = start_workers(url, 1, tmp_path, name="waiter")
    (report,) = results([waiter])
    assert report["outcome"] == "takeover", report
    assert report["compiles"] > 0 and report["max_diff"] < 1e-5
    assert not client.keys("precompile:lease:*"), "a stale lease remains"
    counters = open_cache(url).counters()
    assert counters["takeovers"] == 1 and counters["builds"] == 1, counters
    assert client.get(f"precompile:ref:{report['key']}") is not None


def test_redis_stopped_then_killed_while_workers_load_and_build(redis_server, tmp_path):
    url = redis_server.url(timeout=1)
    (first,), _ = start_workers(url, 1, tmp_path, name="seed")
    (seeded,) = results([first])  # width 32 is stored: the loaders below hit it
    loaders, go_a = start_workers(url, 1, tmp_path, name="load", go=False)
    builders, go_b = start_workers(url, 1, tmp_path, width=48, name="build", go=False)
    redis_server.pause()
    go_a.touch()
    go_b.touch()
    time.sleep(2)
    redis_server.stop()
    reports = results(loaders + builders)
    assert all(r["max_diff"] < 1e-5 for r in reports), reports
    assert reports[0]["key"] == seeded["key"] and reports[1]["key"] != seeded["key"]
    assert all(r["outcome"] == "built" for r in reports), [r["outcome"] for r in reports]
    assert all("unavailable" in r["stderr"] for r in reports)
    assert all(r["seconds"] < 120 for r in reports)


def test_flipped_byte_in_a_redis_chunk_is_detected_dropped_and_rebuilt(redis_server, tmp_path):
    url = redis_server.url(chunk_size="4KiB")
    (first,), _ = start_workers(url, 1, tmp_path, name="first")
    (built,) = results([first])
    cache = open_cache(url)
    manifest = Manifest.from_json(cache.get_blob(cache.get_ref(built["key"])))
    client = redis_server.client()
    chunked = [d for d in manifest.load_digests() if client.exists(f"precompile:blob:{{{d}}}:1")]
    assert chunked, "no blob a load reads was chunked at 4 KiB"
    victim = f"precompile:blob:{{{chunked[0]}}}:1"
    byte = client.getrange(victim, 100, 100)
    client.setrange(victim, 100, bytes([byte[0] ^ 0x40]))
    before = cache.counters()
    (second,), _ = start_workers(url, 1, tmp_path, name="second")
    (rebuilt,) = results([second])
    assert rebuilt["outcome"] == "built" and rebuilt["key"] == built["key"] and rebuilt["max_diff"] < 1e-5
    after = cache.counters()
    assert after["errors"] == before["errors"] + 1 and after["builds"] == before["builds"] + 1, (before, after)
    assert "does not match its digest" in rebuilt["stderr"]
    # the corrupt copy is gone; the rebuilt artifact's parts are whole (a rebuilt .so may differ in bytes and so
    # in digest, hence the re-read of the ref)
    assert client.getrange(victim, 100, 100) != bytes([byte[0] ^ 0x40])
    manifest = Manifest.from_json(cache.get_blob(cache.get_ref(built["key"])))
    assert all(isinstance(v, bytes) for v in cache.get_blobs(manifest.load_digests()).values())
    (third,), _ = start_workers(url, 1, tmp_path, name="third")
    assert results([third])[0]["outcome"] == "hit"
