"""Opening a Redis Cluster cache while every master stalls (issue 34, "Stalls"), on a real cluster of 3 masters with a
replica each, the masters stopped with SIGSTOP (``cluster-node-timeout`` 60 s: no replica is promoted meanwhile).
Before, a worker that had seen the cluster (so knew every node) spent 10 retries while building the client, each
asking stalled masters again, then a second pass: 31 s at ``timeout=2``, 86 s at the default, before it compiled
uncached.  Now each node is asked until its first timeout only; the open gives up where every master timed out
(then the opens after it fail at once for ``down_s`` and the call compiles uncached), and goes on where a replica
answered all it needed.  Shown by the connections each stalled master received during the open (counted by the
server once resumed, before the worker goes on), not by wall time; the worker's compile is right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import spawn_python

from cache_backends import MISS, open_cache

WORKER = """
import json, sys, time, torch, _graphs, precompile
from pathlib import Path
from cache_backends import open_cache
url, go = sys.argv[1], Path(sys.argv[2])
open_cache(url).get_ref("cd" * 32)  # the cluster seen once: this process knows its nodes
gm, inputs = _graphs.graph("dynamo", _graphs.mlp())
with torch.no_grad():
    want = gm(*inputs)
print("ready", flush=True)
while not go.exists():
    time.sleep(0.05)
out = {}
started = time.perf_counter()
try:  # the open during the stall: what is measured
    open_cache(url)
except Exception as err:
    out["open"] = str(err)
out["open_s"] = round(time.perf_counter() - started, 2)
print("opened", flush=True)  # the masters resume now, and what this open asked of them is counted
while not Path(str(go) + ".counted").exists():
    time.sleep(0.05)
art = precompile.standalone_compile(gm, inputs, cache=url)  # after a failed open, its breaker: compiled uncached
got = art(*inputs)
out.update(key=art.key, same=all(torch.allclose(g, w, rtol=1e-4, atol=1e-5) for g, w in zip(got, want)))
try:  # and the next open falls on it too
    open_cache(url)
except Exception as err:
    out["again"] = str(err)
print(json.dumps(out), flush=True)
"""


@pytest.fixture
def cluster(tmp_path):
    from _redis import RedisCluster

    c = RedisCluster(tmp_path / "cluster", replicas=1, node_timeout_ms=60_000).start()
    yield c
    c.stop()


def connections(client) -> int:
    """Connections the server accepted so far (asked over ``client``'s one connection, which counts once)."""
    return int(client.info("stats")["total_connections_received"])


def test_an_open_while_every_master_stalls_asks_each_once_then_compiles_uncached(cluster, tmp_path):
    url = cluster.url(timeout=1, down_s=60)
    go = tmp_path / "go"
    worker = spawn_python(WORKER, url, str(go), timeout=600)
    assert worker.popen.stdout.readline().strip() == "ready"
    masters = cluster.masters_now()
    clients = {n.port: n.client() for n in masters}
    before = {port: connections(c) for port, c in clients.items()}
    for n in masters:
        n.pause()
    try:
        go.touch()
        assert worker.popen.stdout.readline().strip() == "opened"
    finally:  # at once: a stall past the replicas' repl-timeout would have them connect again, counted here too
        for n in masters:
            n.resume()
    # what the open asked of each stalled master, counted before the worker goes on (over a new connection, one
    # more received: a reconnect of the clients above, idle through the stall, is not the worker's)
    asked = {n.port: connections(n.client()) - 1 - before[n.port] for n in masters}
    Path(str(go) + ".counted").touch()
    out = json.loads(worker.wait().splitlines()[-1])
    assert all(v <= 1 for v in asked.values()), (asked, out)  # before: 9-13 each
    assert out["same"], out
    if "open" in out:  # every master it asked timed out: the open gave up, and what follows compiles uncached
        assert "timed out" in out["open"] and sum(asked.values()) >= 1, out
        assert "not trying again" in out.get("again", ""), out
        assert open_cache(cluster.url()).get_ref(out["key"]) is MISS  # nothing stored
