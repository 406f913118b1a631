"""Build leases of a local cache directory (``cache_backends/local/leases.py``), in real processes: never two
holders of one key at once, while holders give leases back and remove their files as fast as others take them;
keys never wait for each other; nothing is left behind.  Take, renew, release, a read-only cache and a killed
holder are in the conformance suite (``tests/_cache_suite.py``)."""

from __future__ import annotations

import json

import pytest
from conftest import spawn_python

from cache_backends.local.cache import LocalCache
from precompile.errors import CacheReadOnlyError

KEY = "c0" * 32
OTHER = "c0" + "de" * 31  # shares KEY's first hex: a lock file of its own all the same

CONTEND = r"""
import json, os, sys, time
from cache_backends.local.cache import LocalCache
root, key, marker, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cache = LocalCache(root)
held = overlaps = 0
deadline = time.monotonic() + 60
while held < rounds and time.monotonic() < deadline:
    token = cache.acquire_lease(key)
    if token is None:
        continue
    held += 1
    try:  # the holder alone may make the marker: another holder at this moment finds it there
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        overlaps += 1
    else:
        os.unlink(marker)
    assert cache.release_lease(key, token)
print(json.dumps({"held": held, "overlaps": overlaps}))
"""


def test_never_two_holders_of_one_key_while_files_come_and_go(tmp_path):
    root = tmp_path / "cache"
    LocalCache(root)
    procs = [spawn_python(CONTEND, str(root), KEY, str(tmp_path / "marker"), "300", timeout=120) for _ in range(4)]
    results = [json.loads(p.wait().strip().splitlines()[-1]) for p in procs]
    assert sum(r["overlaps"] for r in results) == 0, results
    assert all(r["held"] == 300 for r in results), results  # each took it 300 times: nobody was locked out
    assert list((root / "locks" / "lease").iterdir()) == []  # every holder removed its file


def test_keys_do_not_wait_for_each_other_and_a_read_only_cache_creates_nothing(tmp_path):
    cache = LocalCache(tmp_path / "cache")
    token = cache.acquire_lease(KEY)
    other = cache.acquire_lease(OTHER)  # a nested build's key (a piece inside a whole function's build)
    assert token and other and cache.lease_held(KEY) and cache.lease_held(OTHER)
    assert cache.acquire_lease(KEY) is None  # another thread or instance of this process waits too
    assert cache.release_lease(KEY, token) and cache.release_lease(OTHER, other)
    with pytest.raises(ValueError, match="64 hex"):
        cache.acquire_lease("../../etc/passwd")
    read_only = LocalCache(tmp_path / "ro", read_only=True)
    with pytest.raises(CacheReadOnlyError):
        read_only.acquire_lease(KEY)
    assert not read_only.lease_held(KEY) and not (tmp_path / "ro" / "locks" / "lease").exists()


def test_a_link_planted_as_a_lease_file_is_no_lease_and_is_replaced(tmp_path):
    cache = LocalCache(tmp_path / "cache")
    target = tmp_path / "elsewhere"
    target.write_text("not the cache's")
    lease_dir = tmp_path / "cache" / "locks" / "lease"
    lease_dir.mkdir(parents=True)
    (lease_dir / f"{KEY}.lock").symlink_to(target)
    assert not cache.lease_held(KEY)
    token = cache.acquire_lease(KEY)
    assert token and cache.release_lease(KEY, token)
    assert target.read_text() == "not the cache's"
