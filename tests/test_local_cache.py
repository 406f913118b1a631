"""LocalCache (``file://``): real files, real processes, no mocks."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cache_backends import COUNTERS, MISS, digest_bytes, open_cache
from cache_backends.local import LocalCache
from precompile.errors import CacheError, CacheReadOnlyError, CacheURLError

REPO = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "_cache_worker.py"
KEY = "1" * 64
KEY2 = "2" * 64


def blob_file(cache: LocalCache, digest: str) -> Path:
    return cache.root / "blob" / digest[:2] / digest[2:]


def store_artifact(cache: LocalCache, key: str, parts: list[bytes]) -> tuple[str, list[str]]:
    """Write ``parts`` and a manifest naming them, then the ref; returns (manifest digest, part digests)."""
    digests = [cache.put_blob(p) for p in parts]
    manifest = json.dumps({"schema": 1, "blobs": {d: {"size": len(p)} for d, p in zip(digests, parts)}}).encode()
    mdigest = cache.put_blob(manifest)
    cache.set_ref(key, mdigest)
    return mdigest, digests


def set_mtime(path: Path, age_s: float) -> None:
    t = time.time() - age_s
    os.utime(path, (t, t))


# ----------------------------------------------------------------------------------------------- basics
def test_blob_round_trip_and_idempotent_put(tmp_path):
    cache = LocalCache(tmp_path / "c")
    data = b"triton kernel source\n" * 100
    digest = cache.put_blob(data)
    assert digest == digest_bytes(data)
    assert cache.has_blob(digest)
    assert cache.get_blob(digest) == data
    path = blob_file(cache, digest)
    assert path.is_file() and path.stat().st_size < len(data)  # compressed at rest
    assert path.read_bytes()[:4] == b"\x28\xb5\x2f\xfd"  # zstd magic

    before = cache.counters()
    assert before["puts"] == 1 and before["bytes_written"] == path.stat().st_size
    assert cache.put_blob(data, digest) == digest  # idempotent: no second write, no second count
    after = cache.counters()
    assert after["puts"] == 1 and after["bytes_written"] == before["bytes_written"]
    assert after["bytes_read"] == path.stat().st_size

    assert cache.put_blob(b"") == digest_bytes(b"")
    assert cache.get_blob(digest_bytes(b"")) == b""
    empty = digest_bytes(b"")
    assert cache.get_blobs([digest, empty, "f" * 64]) == {digest: data, empty: b"", "f" * 64: MISS}
    assert not list((tmp_path / "c").rglob("*.incomplete"))


def test_put_existing_blob_refreshes_mtime(tmp_path):
    """An idempotent put must protect the blob from eviction's grace-period sweep until the writer's ref lands."""
    cache = LocalCache(tmp_path)
    digest = cache.put_blob(b"x" * 1000)
    set_mtime(blob_file(cache, digest), 3600)
    cache.put_blob(b"x" * 1000)
    assert time.time() - blob_file(cache, digest).stat().st_mtime < 60


def test_miss_semantics_and_bad_names(tmp_path):
    cache = LocalCache(tmp_path)
    assert cache.get_blob("0" * 64) is MISS and not MISS
    assert cache.get_ref("0" * 64) is MISS
    assert cache.has_blob("0" * 64) is False
    assert cache.delete_ref("0" * 64) is False
    for bad in ("abc", "G" * 64, "A" * 64, "0" * 63, "../" + "0" * 61, None):
        with pytest.raises(ValueError):
            cache.get_blob(bad)
        with pytest.raises(ValueError):
            cache.get_ref(bad)
        with pytest.raises(ValueError):
            cache.set_ref(KEY, bad)
        with pytest.raises(ValueError):
            cache.set_ref(bad, "0" * 64)
        with pytest.raises(ValueError):
            cache.has_blob(bad)
    with pytest.raises(ValueError, match="hashes to"):
        cache.put_blob(b"data", "0" * 64)
    assert cache.counters()["puts"] == 0


def test_refs_set_get_delete_iter(tmp_path):
    cache = LocalCache(tmp_path)
    d1, d2 = cache.put_blob(b"one"), cache.put_blob(b"two")
    cache.set_ref(KEY, d1)
    cache.set_ref(KEY2, d2)
    assert cache.get_ref(KEY) == d1
    cache.set_ref(KEY, d2)  # replace atomically
    assert cache.get_ref(KEY) == d2
    assert sorted(cache.iter_refs()) == sorted([(KEY, d2), (KEY2, d2)])
    assert cache.delete_ref(KEY) is True
    assert cache.delete_ref(KEY) is False
    assert cache.get_ref(KEY) is MISS
    assert list(cache.iter_refs()) == [(KEY2, d2)]
    assert [p.name for p in (tmp_path / "ref").iterdir()] == [KEY2]


def test_get_ref_refreshes_lru_time(tmp_path):
    cache = LocalCache(tmp_path)
    cache.set_ref(KEY, cache.put_blob(b"m"))
    ref = tmp_path / "ref" / KEY
    set_mtime(ref, 3600)
    assert cache.get_ref(KEY) != MISS
    assert time.time() - ref.stat().st_mtime < 60


# ------------------------------------------------------------------------------------------- corruption
@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "garbage"])
def test_corrupt_blob_is_a_miss_and_dropped(tmp_path, damage, caplog):
    cache = LocalCache(tmp_path)
    data = os.urandom(2000) + b"tail" * 500
    digest = cache.put_blob(data)
    path = blob_file(cache, digest)
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x01
    elif damage == "truncate":
        raw = raw[: len(raw) // 2]
    elif damage == "empty":
        raw = bytearray()
    else:
        raw = bytearray(b"not zstd at all" * 10)
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="precompile.cache"):
        assert cache.get_blob(digest) is MISS
    assert not path.exists()
    assert cache.counters()["errors"] == 1
    assert any(digest in r.getMessage() and "corrupt" in r.getMessage() for r in caplog.records)
    assert cache.get_blob(digest) is MISS  # now simply absent: no second error
    assert cache.counters()["errors"] == 1
    assert cache.put_blob(data) == digest and cache.get_blob(digest) == data  # a rewrite heals it


def test_flipped_byte_in_every_position_never_returns_wrong_bytes(tmp_path):
    cache = LocalCache(tmp_path)
    data = b"weights are inputs, kernels are blobs\n" * 20
    digest = cache.put_blob(data)
    path = blob_file(cache, digest)
    good = path.read_bytes()
    for i in range(len(good)):
        bad = bytearray(good)
        bad[i] ^= 0x40
        path.write_bytes(bytes(bad))
        assert cache.get_blob(digest) in (MISS, data)  # a flip in unused header bits may still decode right
        path.write_bytes(good)


def test_corrupt_ref_is_a_miss(tmp_path):
    cache = LocalCache(tmp_path)
    (tmp_path / "ref" / KEY).write_text("not a digest\n")
    assert cache.get_ref(KEY) is MISS
    assert not (tmp_path / "ref" / KEY).exists()
    assert cache.counters()["errors"] == 1


def test_get_blobs_parallel_with_corruption(tmp_path):
    cache = LocalCache(tmp_path)
    parts = [os.urandom(5000) for _ in range(12)]
    digests = [cache.put_blob(p) for p in parts]
    blob_file(cache, digests[3]).write_bytes(b"\x28\xb5\x2f\xfd garbage")
    got = cache.get_blobs(digests)
    assert got[digests[3]] is MISS
    assert all(got[d] == p for i, (d, p) in enumerate(zip(digests, parts)) if i != 3)
    assert cache.counters()["errors"] == 1


def test_verify(tmp_path):
    cache = LocalCache(tmp_path)
    mdigest, digests = store_artifact(cache, KEY, [b"a" * 100, b"b" * 100])
    cache.set_ref(KEY2, "e" * 64)  # manifest missing
    report = cache.verify()
    assert report["ok"] is False and report["blobs_checked"] == 3
    assert report["bad_blobs"] == [] and report["dangling_refs"] == [KEY2]
    blob_file(cache, digests[0]).write_bytes(b"rubbish")
    blob_file(cache, mdigest).write_bytes(blob_file(cache, mdigest).read_bytes()[:-3])
    report = cache.verify(fix=True)
    assert sorted(report["bad_blobs"]) == sorted([digests[0], mdigest])
    assert sorted(report["dangling_refs"]) == sorted([KEY, KEY2])
    assert report["removed"] == 4
    assert cache.verify()["ok"] is True
    assert list(cache.iter_refs()) == [] and cache.has_blob(digests[1])


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
from cache_backends.local import LocalCache
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


# --------------------------------------------------------------------------------------------- eviction
def test_lru_eviction(tmp_path):
    cache = LocalCache(tmp_path, max_bytes=60_000, grace_s=0)
    shared = os.urandom(4000)
    keys = [digest_bytes(f"artifact {i}".encode()) for i in range(5)]
    stored = {}
    for i, key in enumerate(keys[:3]):
        stored[key] = store_artifact(cache, key, [shared, os.urandom(8000), os.urandom(8000)])
    assert cache.counters()["evictions"] == 0  # ~ 3 x 16 KB + 4 KB shared: under the cap
    for age, key in zip((300, 200, 100), keys[:3]):
        set_mtime(tmp_path / "ref" / key, age)
    assert cache.get_ref(keys[0]) == stored[keys[0]][0]  # artifact 0 is now the most recently used
    stored[keys[3]] = store_artifact(cache, keys[3], [shared, os.urandom(8000), os.urandom(8000)])
    # 4 x 16 KB + 4 KB > 60 KB: drop LRU refs until <= 54 KB: artifact 1 goes, 0 (read) and 2, 3 stay
    refs = dict(cache.iter_refs())
    assert set(refs) == {keys[0], keys[2], keys[3]}
    assert cache.counters()["evictions"] == 1
    mdigest1, parts1 = stored[keys[1]]
    assert not cache.has_blob(mdigest1) and not any(cache.has_blob(d) for d in parts1[1:])
    assert cache.has_blob(parts1[0])  # the blob shared with surviving artifacts stays
    for key in refs:
        mdigest, parts = stored[key]
        assert json.loads(cache.get_blob(mdigest))["blobs"].keys() == set(parts)
        assert all(cache.get_blob(d) is not MISS for d in parts)
    assert cache.size_bytes() <= 60_000
    assert cache.stats()["bytes_stored"] == cache.size_bytes()


def test_eviction_grace_period_keeps_fresh_unreferenced_blobs(tmp_path):
    cache = LocalCache(tmp_path, max_bytes=25_000)  # default grace: 60 s
    a = store_artifact(cache, KEY, [os.urandom(12_000)])
    set_mtime(tmp_path / "ref" / KEY, 100)
    orphan = cache.put_blob(os.urandom(2_000))  # a concurrent writer whose ref has not landed yet
    b = store_artifact(cache, KEY2, [os.urandom(12_000)])
    assert dict(cache.iter_refs()) == {KEY2: b[0]}
    assert cache.counters()["evictions"] == 1
    # the evicted artifact's blobs and the orphan are unreferenced but fresh: kept
    assert cache.has_blob(orphan) and cache.has_blob(a[0]) and cache.has_blob(a[1][0])
    for d in (orphan, a[0], a[1][0]):
        set_mtime(blob_file(cache, d), 120)
    report = cache.evict()
    assert report["refs_dropped"] == 0 and report["blobs_deleted"] == 3
    assert not cache.has_blob(orphan) and not cache.has_blob(a[0]) and not cache.has_blob(a[1][0])
    assert cache.get_blob(b[1][0]) is not MISS


def test_eviction_skipped_while_another_process_evicts(tmp_path):
    cache = LocalCache(tmp_path, max_bytes=1000, grace_s=0)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import filelock, sys, time; l = filelock.FileLock(sys.argv[1]); l.acquire(); "
         "print('held', flush=True); time.sleep(30)", str(tmp_path / "locks" / "evict.lock")],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        store_artifact(cache, KEY, [os.urandom(2000)])
        store_artifact(cache, KEY2, [os.urandom(2000)])
        assert cache.evict()["skipped"] is True
        assert len(dict(cache.iter_refs())) == 2 and cache.counters()["evictions"] == 0
    finally:
        holder.kill()
        holder.wait()
    assert cache.evict()["skipped"] is False
    assert len(dict(cache.iter_refs())) == 1 and cache.counters()["evictions"] == 1


def test_pluggable_referenced_digests(tmp_path):
    """Another manifest schema: the evictor asks ``referenced_digests`` which blobs a manifest keeps alive."""

    def parts_of(manifest: bytes) -> list[str]:
        return [p["digest"] for p in json.loads(manifest)["parts"]]

    cache = LocalCache(tmp_path, max_bytes=10**9, grace_s=0, referenced_digests=parts_of)
    part = cache.put_blob(b"p" * 100)
    manifest = json.dumps({"parts": [{"digest": part}]}).encode()
    cache.set_ref(KEY, cache.put_blob(manifest))
    garbage = cache.put_blob(b"g" * 100)
    report = cache.evict()
    assert report["blobs_deleted"] == 1
    assert cache.has_blob(part) and not cache.has_blob(garbage)


# ------------------------------------------------------------------------------------------------- URLs
def test_open_cache_urls(tmp_path):
    cache = open_cache(f"file://{tmp_path}/c")
    assert isinstance(cache, LocalCache) and cache.root == tmp_path / "c"
    assert isinstance(open_cache(str(tmp_path / "d")), LocalCache)
    opts = open_cache(f"file://{tmp_path}/c?max_bytes=12345&read_only=0&grace_s=5")
    assert opts.max_bytes == 12345 and opts.grace_s == 5 and not opts.read_only
    again = open_cache(opts.url)
    assert (again.root, again.max_bytes, again.grace_s, again.url) == (opts.root, 12345, 5, opts.url)
    spaced = open_cache(str(tmp_path / "with space"))
    assert open_cache(spaced.url).root == tmp_path / "with space"
    assert open_cache(cache) is cache


@pytest.mark.parametrize(
    "url, match",
    [
        ("s3://bucket/x", "no cache backend handles s3://"),
        ("file://relative/dir", "three slashes"),
        ("file:///tmp/x?max_bytes=-3", "positive integer"),
        ("file:///tmp/x?max_bytes=lots", "positive integer"),
        ("file:///tmp/x?read_only=maybe", "read_only"),
        ("file:///tmp/x?colour=blue", "unknown option 'colour'"),
        ("file:///tmp/x#frag", "fragment"),
        ("", "non-empty"),
    ],
)
def test_bad_urls(url, match):
    with pytest.raises(CacheURLError, match=match):
        open_cache(url)
    with pytest.raises(ValueError):  # CacheURLError is a ValueError too
        open_cache(url)


def test_from_url_rejects_other_schemes():
    with pytest.raises(CacheURLError, match="file://"):
        LocalCache.from_url("redis://localhost:6379")
