"""Faults of a Redis Cluster while workers load and build (issue 29), on a real cluster of 3 masters with a replica
each that this module starts (``cluster-node-timeout`` 1 s, so a failover takes about 2 s) and damages:

- a master stopped (SIGSTOP) for longer than the socket timeout: one timeout, a miss (or a hit served by its
  replica, if that was promoted before the load asked), no crash; after SIGCONT
  (by then its replica was promoted) the cache serves again;
- Redis out of memory (``maxmemory``, ``noeviction``) during a store: the store fails cleanly and the worker serves
  its own build;
- a worker killed while it holds a build lease: another takes over after the lease's TTL;
- ``kill -9`` of a master while 8 worker processes load: its replica is promoted, the workers retry with backoff and
  reconnect, and every one of them loads the stored artifact (no build).

In every case no worker crashes, every output equals eager, builds stay at one per key, and ``verify`` finds
everything stored intact afterwards.  The cluster is killed piece by piece, so the tests run in this order.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import assert_same_output, python_env, run_python
from test_fleet import results, start_workers

import _graphs
import precompile
from cache_backends import MISS, open_cache
from precompile.ops.verify import verify
from precompile.store.cache_io import load_from_cache, store
from precompile.store.coordination import get_or_build


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from _redis import RedisCluster

    c = RedisCluster(tmp_path_factory.mktemp("faults"), replicas=1, node_timeout_ms=1000).start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def seeded(cluster, artifacts):
    """The make_fx MLP's artifact (the key tests/_fleet_worker.py computes at width 32), stored in the cluster."""
    c = artifacts("make_fx")
    assert store(open_cache(cluster.url()), c.art)
    return c


def intact(url: str) -> bool:
    report = verify(open_cache(url))
    assert not report.problems, report.to_dict()
    return report.ok


def test_a_master_stopped_past_the_socket_timeout_costs_a_miss_then_serves_again(cluster, seeded):
    url = cluster.url(timeout=1, down_s=1)
    victim = cluster.node_of(f"precompile:ref:{seeded.art.key}")
    victim.pause()
    try:
        start = time.monotonic()
        art = load_from_cache(seeded.art.key, url)  # the ref's master answers nothing: a miss, as a rule
        took = time.monotonic() - start
        print(f"a load with the ref's master stopped: {'a miss' if art is None else 'a hit'} in {took:.2f} s "
              "(timeout 1 s)")
        assert took < 10, "a load hung on a stopped master"
        if art is not None:  # on a loaded machine its replica can be promoted before the load asks: a true hit
            assert_same_output(art(*seeded.inputs), seeded.expected)
        time.sleep(2.5)  # stopped past the node timeout: the cluster promotes its replica
    finally:
        victim.resume()
    cluster.wait_ok(60, replicas=3)  # the old master rejoins as a replica of the new one
    deadline = time.monotonic() + 30
    while (art := load_from_cache(seeded.art.key, url)) is None:
        assert time.monotonic() < deadline, "the cache did not serve again after SIGCONT"
        time.sleep(0.5)
    assert_same_output(art(*seeded.inputs), seeded.expected)
    assert intact(cluster.url())


def test_out_of_memory_during_a_store_fails_it_cleanly_and_the_worker_serves_its_build(cluster):
    url = cluster.url(timeout=2)
    gm, inputs = _graphs.graph("make_fx", _graphs.mlp(h=48))
    with torch.no_grad():
        want = gm(*inputs)
    masters = cluster.masters_now()
    for m in masters:
        used = int(m.client().info("memory")["used_memory"])
        m.client().config_set("maxmemory-policy", "noeviction")
        m.client().config_set("maxmemory", used + 16_384)  # no room for a compiled kernel
    try:
        art = precompile.standalone_compile(gm, inputs, cache=url)
        assert art.outcome == "built"
        assert_same_output(art(*inputs), want)
        assert load_from_cache(art.key, url) is None, "an artifact was stored although Redis was out of memory"
    finally:
        for m in masters:
            m.client().config_set("maxmemory", 0)
    assert intact(cluster.url())  # no half-written blob passes for a whole one
    again = precompile.standalone_compile(gm, inputs, cache=url)  # with room again: built once more and stored
    assert again.outcome == "built" and load_from_cache(again.key, url) is not None


HOLDER = r"""
import sys, time
from cache_backends import open_cache
token = open_cache(sys.argv[1]).acquire_lease(sys.argv[2])
print("held" if token else "refused", flush=True)
time.sleep(120)
"""


def test_a_worker_killed_holding_a_build_lease_is_taken_over_after_its_ttl(cluster):
    url = cluster.url(lease_ttl=2, timeout=2)
    key = "5e" * 32
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, url, key], stdout=subprocess.PIPE, text=True,
                              env=python_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        holder.send_signal(signal.SIGKILL)  # mid-build, holding the lease
        holder.wait(timeout=10)
        builds = []
        art, outcome = get_or_build(open_cache(url), key, lambda: None, lambda: builds.append(1) or "built here")
    finally:
        holder.kill()
        holder.wait(timeout=10)
    assert (art, outcome) == ("built here", "takeover") and builds == [1]
    assert not open_cache(url).lease_held(key)


def test_a_master_killed_while_eight_workers_load(cluster, seeded, tmp_path):
    ref = f"precompile:ref:{seeded.art.key}"
    victim = cluster.node_of(ref)  # the master of the artifact's ref; the URL names another node
    url = cluster.url(via=next(n for n in cluster.alive() if n is not victim), timeout=2)
    before = open_cache(url).counters()
    via_victim = cluster.url(via=victim, timeout=2)
    assert open_cache(via_victim).get_ref(seeded.art.key) is not MISS  # this process has seen the nodes
    procs, go = start_workers(url, 8, tmp_path, go=False)
    go.touch()
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(timeout=10)
    reports = results(procs)
    assert all(r["key"] == seeded.art.key for r in reports)
    assert all(r["max_diff"] < 1e-5 for r in reports), [r["max_diff"] for r in reports]
    assert any("failing over" in r["stderr"] for r in reports), "no worker saw the failover: nothing was tested"
    outcomes = [r["outcome"] for r in reports]
    assert outcomes.count("hit") == 8 and all(r["compiles"] == 0 for r in reports), outcomes
    promoted = cluster.node_of(ref)
    assert promoted is not victim and cluster.role(promoted) == "master"
    counters = open_cache(url).counters()
    assert counters["builds"] == before["builds"] and counters["hits"] - before["hits"] == 8, (before, counters)
    assert intact(url)
    # a cache opened later with the dead node's URL finds the cluster through the nodes this process saw before
    assert load_from_cache(seeded.art.key, via_victim) is not None


def test_a_failover_that_never_ends_costs_retry_s_once_then_fails_fast(tmp_path):
    """A master lost with no replica to promote: the first call rides it out for ``retry_s``, then the cache counts
    Redis as down, so the calls after it fail at once instead of each spending ``retry_s`` again."""
    from _redis import RedisCluster

    from precompile.errors import CacheUnavailableError

    lone = RedisCluster(tmp_path / "lone", replicas=0, node_timeout_ms=1000).start()
    try:
        cache = open_cache(lone.url(retry_s=1.5, down_s=30, timeout=1))
        key = "7a" * 32
        cache.set_ref(key, "0b" * 32)
        lone.node_of(f"precompile:ref:{key}").stop()
        start = time.monotonic()
        with pytest.raises(CacheUnavailableError):
            cache.get_ref(key)
        first = time.monotonic() - start
        start = time.monotonic()
        with pytest.raises(CacheUnavailableError, match="unavailable"):
            cache.get_ref(key)
        assert 1.5 <= first < 8 and time.monotonic() - start < 0.5, first
    finally:
        lone.stop()


def test_with_more_nodes_in_the_url_a_worker_opens_the_cache_while_the_urls_node_is_down(tmp_path):
    """A fresh process asks the URL's node for the slot map; ``nodes=`` names others to ask when it is down (a
    fleet restarting while that node is lost would otherwise compile everything uncached)."""
    from _redis import RedisCluster

    c = RedisCluster(tmp_path / "seeds", replicas=0, node_timeout_ms=1000).start()
    try:
        first, *others = c.nodes
        # a ref whose master stays up
        key = next(k for k in (f"{i:02x}" * 32 for i in range(256)) if c.node_of(f"precompile:ref:{k}") is not first)
        cache = open_cache(c.url(via=first))
        digest = cache.put_blob(b"stored")
        cache.set_ref(key, digest)
        first.stop()
        seeds = ",".join(f"127.0.0.1:{n.port}" for n in others)
        probe = f"""
import sys
from cache_backends import open_cache
from precompile.errors import CacheUnavailableError
try:
    open_cache(sys.argv[1])
    print("opened without nodes=")
except CacheUnavailableError:
    print("unavailable")
print(open_cache(sys.argv[1] + "&nodes={seeds}").get_ref(sys.argv[2]))
"""
        out = run_python(probe, c.url(via=first), key).split()
        assert out == ["unavailable", digest], out
    finally:
        c.stop()
