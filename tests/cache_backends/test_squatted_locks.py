"""A local cache's lock files held by another process that never lets go (issue 34, "Stalls"): a user with read
access only may ``flock`` them (lock files are 0644, and ``flock`` needs no write access).  A load never waits
on the stats lock and loses no count; a near miss waits for the fetch locks at most ``fetch_wait`` (default 1 s),
then fetches on its own.  The holders are real processes; how long a call takes is measured by
``tools/bench/squatting.py`` (its ``stats`` and ``fetch`` cases), not asserted here."""

from __future__ import annotations

import json
import os
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import python_env

from cache_backends import open_cache
from cache_backends.local.cache import LocalCache

HOLD = """
import fcntl, os, sys
fds = [os.open(p, os.O_RDONLY) for p in sys.argv[1:]]  # read access is enough for flock
for fd in fds:
    fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


class Holder:
    """A process that holds ``flock`` on ``paths`` (opened read-only) until stopped."""

    def __init__(self, *paths: Path):
        for p in paths:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.touch()
        self.proc = subprocess.Popen([sys.executable, "-c", HOLD, *map(str, paths)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "held"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)

    def __enter__(self) -> Holder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stored_counts(root: Path) -> dict[str, int]:
    path = root / "stats.json"
    return json.loads(path.read_text()) if path.exists() else {}


# ------------------------------------------------------------------------------------------------ stats lock
def test_a_held_stats_lock_keeps_counts_in_the_process_and_loses_none(tmp_path):
    cache = LocalCache(tmp_path)
    digest = cache.put_blob(b"kernel")
    cache.incr(hits=1)
    before = stored_counts(tmp_path)
    with Holder(tmp_path / "locks" / "stats.lock"):
        assert cache.get_blob(digest) == b"kernel"  # counts bytes_read: returns, the lock still held
        cache.incr(hits=2, misses=1)
        assert stored_counts(tmp_path) == before  # nothing written while it is held
        shown = cache.counters()
        assert shown["hits"] == 3 and shown["misses"] == 1 and shown["bytes_read"] > before["bytes_read"]
    cache.incr(builds=1)  # the lock is free again: everything kept is folded in
    after = stored_counts(tmp_path)
    assert after["hits"] == 3 and after["misses"] == 1 and after["builds"] == 1
    assert after["bytes_read"] == shown["bytes_read"]


WORKER = """
import sys
from cache_backends.local.cache import LocalCache
cache = LocalCache(sys.argv[1])
cache.incr(hits=5, misses=2)
print("counted", flush=True)
sys.stdin.readline()
"""  # exits without close(): the exit hook folds the counts in


def test_counts_kept_while_the_lock_was_held_are_persisted_at_exit(tmp_path):
    LocalCache(tmp_path).incr(hits=1)
    holder = Holder(tmp_path / "locks" / "stats.lock")
    try:
        worker = subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=python_env())
        assert worker.stdout.readline().strip() == "counted"
        assert stored_counts(tmp_path)["hits"] == 1
    finally:
        holder.stop()
    worker.communicate("exit\n", timeout=60)
    assert worker.returncode == 0
    assert stored_counts(tmp_path)["hits"] == 6 and stored_counts(tmp_path)["misses"] == 2


# ------------------------------------------------------------------------------------------------ fetch locks
def test_held_fetch_locks_cost_a_near_miss_the_short_wait_said_once(tmp_path, redis_server, caplog):
    """Each near miss waits the default ``fetch_wait`` (1 s in all), then fetches the blob itself, right; the wait
    is a warning the first time in the process, a debug line after."""
    remote = open_cache(redis_server.url())
    blobs = {remote.put_blob(os.urandom(3000)): None for _ in range(2)}
    blobs = {d: remote.get_blob(d) for d in blobs}
    near = tmp_path / "near"
    LocalCache(near)
    locks = [near / "locks" / "fetch" / f"{d[:3]}.lock" for d in blobs]
    with Holder(*locks):
        with caplog.at_level(logging.DEBUG, logger="precompile.cache"):
            for d, data in blobs.items():
                cache = open_cache(f"file://{near}|{redis_server.url()}")  # a fresh cache per call, as callers do
                assert cache.get_blob(d) == data
        said = [r for r in caplog.records if "fetching them here as well" in r.getMessage()]
        assert [r.levelno for r in said] == [logging.WARNING, logging.DEBUG], said
    assert LocalCache(near).counters()["remote_blobs"] == 2
    assert all(LocalCache(near).get_blob(d) == data for d, data in blobs.items())  # backfilled
