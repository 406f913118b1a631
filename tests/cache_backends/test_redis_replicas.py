"""Blobs read from a Redis Cluster's replicas (cache_backends/redis/replicas.py), on a real cluster of 3 masters with a
replica each: reads spread over masters and replicas; a replica that lacks a blob (lag) or holds a damaged copy costs
a read from the master, never a miss, a drop or an error; refs and writes stay on the masters; ``replica_reads=0``."""

from __future__ import annotations

import os
from contextlib import ExitStack, contextmanager

import pytest
from _cache_backends import unique_prefix

from cache_backends import MISS, open_cache
from precompile.errors import CacheURLError


def getrange_calls(node) -> int:
    return int(node.client().info("commandstats").get("cmdstat_getrange", {}).get("calls", 0))


@contextmanager
def replication_held(replica):
    """The replica stops applying its master's stream inside the block (CLIENT PAUSE WRITE: it still serves reads),
    as a lagging replica does; it catches up after."""
    client = replica.client()
    client.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")
    try:
        yield
    finally:
        client.execute_command("CLIENT", "UNPAUSE")


def test_reads_spread_over_masters_and_replicas_and_refs_stay_on_masters(redis_cluster):
    cache = open_cache(redis_cluster.url(prefix=unique_prefix(), chunk_size="8KiB"))
    assert cache.replica_reads and cache.stats()["replica_reads"] is True
    blobs = [os.urandom(20_000) for _ in range(24)]  # 3 chunks each
    digests = [cache.put_blob(b) for b in blobs]
    cache.set_ref("ab" * 32, digests[0])
    masters = redis_cluster.masters_now()
    replicas = [n for n in redis_cluster.alive() if n not in masters]
    before = {n.port: getrange_calls(n) for n in redis_cluster.alive()}
    for _ in range(4):
        assert cache.get_blobs(digests) == dict(zip(digests, blobs))
    served = {n.port: getrange_calls(n) - before[n.port] for n in redis_cluster.alive()}
    on_replicas = sum(served[n.port] for n in replicas)
    assert on_replicas > 0 and sum(served[n.port] for n in masters) > 0, served
    assert cache.counters()["replica_hits"] >= 24
    gets = {n.port: int(n.client().info("commandstats").get("cmdstat_get", {}).get("calls", 0)) for n in replicas}
    assert cache.get_ref("ab" * 32) == digests[0]
    assert all(int(n.client().info("commandstats").get("cmdstat_get", {}).get("calls", 0)) == gets[n.port]
               for n in replicas), "a ref was read from a replica"


def test_a_replica_that_lacks_a_blob_or_holds_a_damaged_copy_costs_a_master_read(redis_cluster):
    prefix = unique_prefix()
    cache = open_cache(redis_cluster.url(prefix=prefix))
    damaged = os.urandom(3000)
    d_bad = cache.put_blob(damaged)
    head = f"{prefix}:blob:{{{d_bad}}}"
    master = redis_cluster.node_of(head)
    intact = master.client().get(head)
    master.client().setrange(head, 100, bytes([intact[100] ^ 0x01]))
    master.client().execute_command("WAIT", 1, 1000)  # its replica holds the damaged copy too
    lagging = os.urandom(3000)
    replicas = [n for n in redis_cluster.alive() if n not in redis_cluster.masters_now()]
    with ExitStack() as held:
        for replica in replicas:
            held.enter_context(replication_held(replica))
        master.client().set(head, intact)  # the master's copy is whole again, its replica's is not
        d_lag = cache.put_blob(lagging)  # on its master only, for now
        lag_head = f"{prefix}:blob:{{{d_lag}}}"
        (lag_replica,) = redis_cluster.replicas_of(redis_cluster.node_of(lag_head))
        on_replica = lag_replica.client()
        on_replica.execute_command("READONLY")
        assert not on_replica.exists(lag_head)
        counters = cache.counters()
        for _ in range(16):  # a random node of the slot each time: the replicas are read (2**-16 odds they are not)
            assert cache.get_blobs([d_bad, d_lag]) == {d_bad: damaged, d_lag: lagging}
        after = cache.counters()
    assert after["replica_fallbacks"] - counters.get("replica_fallbacks", 0) >= 2, after
    assert after["errors"] == counters["errors"], "a replica's copy was counted as an error"
    assert master.client().get(head) == intact, "a replica's damaged copy got the master's dropped"


def test_replica_reads_off_reads_masters_only(redis_cluster):
    cache = open_cache(redis_cluster.url(prefix=unique_prefix(), replica_reads=0))
    assert not cache.replica_reads
    digests = [cache.put_blob(os.urandom(2000)) for _ in range(12)]
    masters = redis_cluster.masters_now()
    replicas = [n for n in redis_cluster.alive() if n not in masters]
    before = {n.port: getrange_calls(n) for n in replicas}
    for _ in range(3):
        assert MISS not in cache.get_blobs(digests).values()
    assert all(getrange_calls(n) == before[n.port] for n in replicas)


def test_replica_reads_need_a_cluster(redis_server):
    with pytest.raises(CacheURLError, match="replica_reads=1 needs a Redis Cluster"):
        open_cache(redis_server.url(replica_reads=1))
    with pytest.raises(CacheURLError, match="nodes= .* needs a Redis Cluster"):
        open_cache(redis_server.url(nodes="127.0.0.1:7000"))
    for bad in ("127.0.0.1", "h:0", "h:70000", "h:x", ":6379", "a/b:1", "h:1,"):
        with pytest.raises(CacheURLError, match="nodes= must list host:port pairs"):
            open_cache(f"redis://127.0.0.1:1/?cluster=1&nodes={bad}")
    assert not open_cache(redis_server.url(replica_reads=0)).replica_reads


def test_cluster_clients_ask_command_of_random_nodes_not_all_of_one(redis_cluster):
    """Every cluster client asks ``COMMAND`` (~90 KB of reply) as it starts; a storm's clients must not all ask the
    same node (docs/fleet.md: it made one master the busiest node of every storm)."""
    def command_calls(node) -> int:
        return int(node.client().info("commandstats").get("cmdstat_command", {}).get("calls", 0))

    before = {n.port: command_calls(n) for n in redis_cluster.alive()}
    caches = [open_cache(redis_cluster.url(prefix=unique_prefix())) for _ in range(12)]
    for cache in caches:
        assert cache.get_blobs([cache.put_blob(os.urandom(100))])  # the replica client starts too
    asked = {n.port: command_calls(n) - before[n.port] for n in redis_cluster.alive()}
    assert sum(asked.values()) >= 12 and sum(1 for v in asked.values() if v) >= 2, asked
    assert max(asked.values()) < sum(asked.values()) * 0.75, asked
    masters = {n.port for n in redis_cluster.masters_now()}
    if _redis_py_version() < (8, 2):  # replicas too (2**-12 odds none is asked); redis-py 8.2 sends a keyless
        # command to a random master unless the client reads from replicas itself (ours picks nodes per read)
        assert sum(v for port, v in asked.items() if port not in masters) > 0, asked
    else:
        assert sum(1 for port, v in asked.items() if v and port in masters) >= 2, asked
    for cache in caches:
        cache.close()


def test_a_worker_holds_one_connection_a_node_and_asks_command_once(redis_cluster):
    """A cache reading from masters and replicas does it through one cluster client: at most one connection to each
    node, one ``COMMAND`` (~90 KB) as it starts.  (A second client for the replicas cost every worker 3 more
    connections and a second ``COMMAND``: docs/fleet.md, "The capacity model".)"""
    prefix = unique_prefix()
    writer = open_cache(redis_cluster.url(prefix=prefix, chunk_size="8KiB"))
    digests = [writer.put_blob(os.urandom(20_000)) for _ in range(24)]  # chunks on slots of every master
    writer.close()

    def command_calls() -> int:
        return sum(int(n.client().info("commandstats").get("cmdstat_command", {}).get("calls", 0))
                   for n in redis_cluster.alive())

    before = command_calls()
    name = "w" + prefix
    worker = open_cache(redis_cluster.url(prefix=prefix, read_only=1, client_name=name))
    for _ in range(4):  # a random node of each slot every time: every node is read (2**-96 odds one is not)
        assert MISS not in worker.get_blobs(digests).values()
    assert worker.counters()["replica_hits"] > 0
    held = {n.port: sum(1 for c in n.client().client_list() if c.get("name") == name) for n in redis_cluster.alive()}
    assert all(held.values()) and max(held.values()) == 1, held
    assert command_calls() - before == 1
    worker.close()


def test_a_user_that_may_not_send_readonly_reads_from_the_masters(redis_cluster, caplog):
    prefix = unique_prefix()
    nodes = redis_cluster.alive()
    for n in nodes:  # ACLs are per node
        n.client().execute_command("ACL", "SETUSER", prefix, "on", ">pw", "~*", "+@all", "-readonly")
    try:
        writer = open_cache(redis_cluster.url(prefix=prefix))
        blobs = [os.urandom(3000) for _ in range(12)]
        digests = [writer.put_blob(b) for b in blobs]
        url = redis_cluster.url(prefix=prefix, read_only=1).replace("redis://", f"redis://{prefix}:pw@")
        worker = open_cache(url)
        with caplog.at_level("WARNING", logger="precompile.cache"):
            assert worker.get_blobs(digests) == dict(zip(digests, blobs))
        assert worker.counters().get("errors", 0) == 0 and worker.counters()["replica_fallbacks"] == 12
        assert any("reading from the masters" in r.getMessage() and "'readonly'" in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
        worker.close()
        writer.close()
    finally:
        for n in nodes:
            n.client().execute_command("ACL", "DELUSER", prefix)


def _redis_py_version() -> tuple[int, ...]:
    import redis

    return tuple(int(p) for p in redis.__version__.split(".")[:2] if p.isdigit())
