"""One conformance suite (tests/_cache_suite.py) run against every cache backend, on real storage: a directory, one
redis-server, a Redis Cluster of 3 masters with a replica each, and a directory in front of a redis-server.

A new backend passes it with one class like these (its ``backend`` fixture opens caches on real storage)."""

from __future__ import annotations

import pytest
from _cache_suite import CacheSuite, ClusterBackend, LocalBackend, RedisBackend, TieredBackend


class TestLocal(CacheSuite):
    @pytest.fixture
    def backend(self, tmp_path):
        return LocalBackend(tmp_path / "cache")


class TestRedis(CacheSuite):
    @pytest.fixture
    def backend(self, redis_server):
        return RedisBackend(redis_server)


class TestRedisCluster(CacheSuite):
    @pytest.fixture
    def backend(self, redis_cluster):
        return ClusterBackend(redis_cluster)


class TestTiered(CacheSuite):
    @pytest.fixture
    def backend(self, tmp_path, redis_server):
        return TieredBackend(tmp_path / "near", redis_server)
