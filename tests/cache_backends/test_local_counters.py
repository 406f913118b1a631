"""LocalCache counters, read-only caches (by option and by file permissions) and many real processes on one
directory (no lost increment, no broken artifact).  No mocks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _local import KEY, KEY2

from cache_backends import COUNTERS, MISS, digest_bytes, open_cache
from cache_backends.local.cache import LocalCache
from precompile.errors import CacheError, CacheReadOnlyError

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parents[1] / "_cache_worker.py"


# --------------------------------------------------------------------------------------------- counters
def test_counters_persist_across_instances(tmp_path):
    cache = LocalCache(tmp_path)
    cache.incr(hits=3, misses=1, builds=1)
    cache.incr(hits=1)
    cache.close()
    again = LocalCache(tmp_path)
    counters = again.counters()
    assert set(COUNTERS) <= set(counters)
    assert counters["hits"] == 4 and counters["misses"] == 1 and counters["builds"] == 1
    stats = again.stats()
    assert stats["hit_rate"] == pytest.approx(0.8)
    assert stats["backend"] == "LocalCache" and stats["url"] == again.url
    assert stats["bytes_stored"] == 0 and stats["max_bytes"] == again.max_bytes
    json.dumps(stats)
    assert json.loads((tmp_path / "stats.json").read_text())["hits"] == 4


def test_corrupt_stats_file_does_not_break_incr(tmp_path):
    (tmp_path / "stats.json").write_text("{not json")
    cache = LocalCache(tmp_path)
    cache.incr(hits=2)
    assert cache.counters()["hits"] == 2


# -------------------------------------------------------------------------------------------- read-only
def test_read_only_option(tmp_path):
    LocalCache(tmp_path).set_ref(KEY, LocalCache(tmp_path).put_blob(b"stored earlier"))
    cache = open_cache(f"file://{tmp_path}?read_only=1")
    assert isinstance(cache, LocalCache) and cache.read_only
    with pytest.raises(CacheReadOnlyError, match="nothing will be cached here") as info:
        cache.put_blob(b"new")
    assert str(tmp_path) in str(info.value)
    assert isinstance(info.value, PermissionError) and isinstance(info.value, CacheError)
    with pytest.raises(CacheReadOnlyError):
        cache.set_ref(KEY2, digest_bytes(b"new"))
    with pytest.raises(CacheReadOnlyError):
        cache.delete_ref(KEY)
    with pytest.raises(CacheReadOnlyError):
        cache.evict()
    # reads keep working; counters stay in memory and the directory is not modified
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    stats_before = (tmp_path / "stats.json").read_text()
    assert cache.get_blob(cache.get_ref(KEY)) == b"stored earlier"
    cache.incr(hits=1)
    assert cache.counters()["hits"] == 1
    assert (tmp_path / "stats.json").read_text() == stats_before
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert open_cache(cache.url).read_only


def test_read_only_on_missing_directory(tmp_path):
    cache = LocalCache(tmp_path / "nope", read_only=True)
    assert cache.get_blob("0" * 64) is MISS and cache.get_ref(KEY) is MISS and list(cache.iter_refs()) == []
    assert cache.size_bytes() == 0 and cache.verify()["ok"] is True
    cache.incr(misses=1)
    assert cache.counters()["misses"] == 1
    assert not (tmp_path / "nope").exists()


_READ_ONLY_CHECK = r"""
import json, logging, sys
from cache_backends.local.cache import LocalCache
from precompile.errors import CacheReadOnlyError
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
cache = LocalCache(sys.argv[1])
for _ in range(5):
    cache.incr(hits=1)  # must never raise
out = {"hits": cache.counters()["hits"]}
try:
    cache.put_blob(b"new")
    out["put"] = "stored"
except CacheReadOnlyError as err:
    out["put"] = str(err)
for _ in range(3):
    try:
        cache.set_ref("2" * 64, "3" * 64)
    except CacheReadOnlyError:
        pass
cache.incr(misses=1)
out["read_only"] = cache.read_only
out["read"] = cache.get_blob(cache.get_ref("1" * 64)).decode()
print(json.dumps(out))
"""


def _without_root_powers() -> list[str] | None:
    """Command prefix that runs a process subject to file permissions, or None if that is impossible here."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    probe = subprocess.run(
        [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner", sys.executable, "-c", "pass"],
        capture_output=True,
    )
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner"] if probe.returncode == 0 else None


def test_directory_without_write_permission(tmp_path):
    """A real directory we may not write (chmod 0o555): reads work, writes raise CacheReadOnlyError, incr never
    raises and warns once.  As root, permissions are only enforced once CAP_DAC_OVERRIDE is dropped (setpriv)."""
    prefix = _without_root_powers()
    if prefix is None:
        pytest.skip("running as root without setpriv: chmod 0o555 does not stop root from writing, so a real "
                    "read-only directory cannot be made here (the read_only=True path is tested separately)")
    cache_dir = tmp_path / "c"
    writer = LocalCache(cache_dir)
    writer.set_ref(KEY, writer.put_blob(b"stored earlier"))
    dirs = [d for d in [cache_dir, *cache_dir.rglob("*")] if d.is_dir()]
    for d in dirs:
        d.chmod(0o555)
    try:
        proc = subprocess.run(
            [*prefix, sys.executable, "-c", _READ_ONLY_CHECK, str(cache_dir)],
            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    finally:
        for d in dirs:
            d.chmod(0o755)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["hits"] == 5
    assert "nothing will be cached here" in out["put"] and str(cache_dir) in out["put"]
    assert out["read_only"] is True and out["read"] == "stored earlier"
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING")]
    assert sum("counters" in w for w in warnings) == 1, proc.stderr  # one warning per instance, not per incr
    assert len(warnings) == 2, proc.stderr  # + one for turning read-only
    assert LocalCache(cache_dir).counters()["hits"] == 0  # nothing was persisted


# ------------------------------------------------------------------------------------------ concurrency
def run_workers(root: Path, n: int, rounds: int, tmp_path: Path, *extra: str) -> list[dict]:
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(root), str(i), str(rounds), str(go), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for i in range(n)
    ]
    time.sleep(0.3)
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, f"worker failed:\n{err}"
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_many_processes_one_directory(tmp_path):
    root = tmp_path / "c"
    n, rounds = 8, 25
    results = run_workers(root, n, rounds, tmp_path)
    cache = LocalCache(root)
    counters = cache.counters()
    # no lost increment
    assert counters["hits"] == n * rounds
    assert counters["misses"] == 2 * n * rounds
    assert counters["builds"] == 3 * n * rounds
    assert counters["errors"] == 0
    # every blob verifies, every ref points at an existing manifest whose blobs all exist
    report = cache.verify()
    assert report["ok"], report
    distinct = report["blobs_checked"]
    assert distinct == 4 + 2 * n * rounds  # shared + own + one manifest per round and worker
    assert distinct <= counters["puts"] <= distinct + 4 * n  # racing writers of one blob may both count it
    refs = dict(cache.iter_refs())
    assert len(refs) == n * rounds + 1
    assert all(key in refs for r in results for key in r["keys"])
    for key, mdigest in refs.items():
        manifest = json.loads(cache.get_blob(mdigest))
        assert all(cache.get_blob(d) is not MISS for d in manifest["blobs"])
    assert not list(root.rglob("*.incomplete")) and not list((root / "tmp").iterdir())


def test_many_processes_with_eviction(tmp_path):
    root = tmp_path / "c"
    results = run_workers(root, 4, 20, tmp_path, "6000")
    cache = LocalCache(root, max_bytes=6000)
    counters = cache.counters()
    assert counters["hits"] == 80 and counters["errors"] == 0
    assert counters["evictions"] > 0
    report = cache.verify()
    assert report["bad_blobs"] == [] and report["dangling_refs"] == []
    assert len(dict(cache.iter_refs())) < 4 * 20 + 1
    assert results
