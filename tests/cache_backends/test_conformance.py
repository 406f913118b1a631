"""One conformance suite (tests/_cache_suite.py) run against every cache backend, on real storage: a directory, one
redis-server, a Redis Cluster of 3 masters with a replica each, and a directory in front of a redis-server.

A new backend passes it with one class like these (its ``backend`` fixture opens caches on real storage)."""

from __future__ import annotations

import pytest
from _cache_backends import ClusterBackend, LocalBackend, RedisBackend, TieredBackend
from _cache_suite import CacheSuite


class TestLocal(CacheSuite):
    @pytest.fixture
    def backend(self, tmp_path):
        return LocalBackend(tmp_path / "cache")


class TestRedis(CacheSuite):
    @pytest.fixture
    def backend(self, redis_server):
        return RedisBackend(redis_server)


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory):
    """A cluster of its own (3 masters, a replica each) whose 30 s node timeout no stalled block reaches: the
    outage test stops every node, which must neither fail a master over nor touch the session's cluster."""
    from _redis import RedisCluster

    cluster = RedisCluster(tmp_path_factory.mktemp("conformance"), replicas=1, node_timeout_ms=30_000).start()
    yield cluster
    cluster.stop()


class TestRedisCluster(CacheSuite):
    @pytest.fixture
    def backend(self, own_cluster):
        return ClusterBackend(own_cluster)


class TestTiered(CacheSuite):
    @pytest.fixture
    def backend(self, tmp_path, redis_server):
        return TieredBackend(tmp_path / "near", redis_server)
