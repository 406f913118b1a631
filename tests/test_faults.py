"""Bad input and faults, for real: damaged cache blobs, truncated and foreign artifact files, wrong call inputs,
graphs that cannot be serialized, read-only caches, several processes building into one cache at once."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest
import torch

import _graphs
import precompile
from cache_backends.local import LocalCache
from conftest import assert_same_output, spawn_python, without_root_powers
from precompile.errors import ArtifactFormatError, InputMismatchError, UnserializableGraphError


def blob_path(root: Path, digest: str) -> Path:
    return root / "blob" / digest[:2] / digest[2:]


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """``{relative path: (size, mtime_ns)}`` of every file under ``root``."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


# ------------------------------------------------------------------------------------ damaged cache blobs
def _target_digest(root: Path, key: str, role: str) -> str:
    manifest_digest = (root / "ref" / key).read_text().strip()
    if role == "manifest":
        return manifest_digest
    manifest = json.loads(LocalCache(root).get_blob(manifest_digest))
    if role == "engine_payload":
        return manifest["parts"]["engine_payload"]
    if role == "kernel_binary":
        return next(iter(manifest["kernels"][0]["binaries"].values()))
    raise ValueError(role)


@pytest.mark.parametrize("role, damage", [("engine_payload", "flip"), ("kernel_binary", "flip"), ("manifest", "flip"),
                                          ("kernel_binary", "truncate")])
def test_damaged_blob_is_detected_dropped_and_rebuilt(role, damage, artifacts, cache_copy, caplog):
    c = artifacts("dynamo")
    root = cache_copy()
    digest = _target_digest(root, c.art.key, role)
    path = blob_path(root, digest)
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x10
    else:
        raw = raw[: len(raw) // 2]
    path.write_bytes(bytes(raw))
    before = LocalCache(root).counters()

    url = "file://" + str(root)
    with caplog.at_level(logging.WARNING, logger="precompile"):
        art = precompile.standalone_compile(c.gm, c.inputs, cache=url)
    assert art.source == "compiled", "a damaged entry was used"
    assert_same_output(art(*c.inputs), c.expected)
    after = LocalCache(root).counters()
    assert after["errors"] >= before["errors"] + 1, "the damaged blob was not counted"
    assert after["builds"] == before["builds"] + 1 and after["misses"] == before["misses"] + 1
    assert after["hits"] == before["hits"]
    assert any(digest in r.getMessage() and "corrupt" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
    # the entry was replaced by the rebuild: the cache verifies and the next call is a hit
    report = LocalCache(root).verify()
    assert report["ok"], report
    assert LocalCache(root).get_ref(c.art.key)
    again = precompile.standalone_compile(c.gm, c.inputs, cache=url)
    assert again.source == "cache"
    assert_same_output(again(*c.inputs), c.expected)


def test_missing_blob_is_a_miss_and_rebuilt(artifacts, cache_copy):
    c = artifacts("dynamo")
    root = cache_copy()
    blob_path(root, _target_digest(root, c.art.key, "engine_payload")).unlink()
    before = LocalCache(root).counters()
    art = precompile.standalone_compile(c.gm, c.inputs, cache="file://" + str(root))
    assert art.source == "compiled"
    assert_same_output(art(*c.inputs), c.expected)
    assert LocalCache(root).counters()["builds"] == before["builds"] + 1
    assert LocalCache(root).verify()["ok"]


def test_damaged_part_that_load_does_not_read(artifacts, cache_copy, tmp_path):
    """A hit reads only what it runs (engine payload, binaries); a damaged kernel *source* is never executed, is
    detected when read (e.g. by ``save``), dropped and counted, and the next get-or-build rebuilds the entry."""
    c = artifacts("dynamo")
    root = cache_copy()
    url = "file://" + str(root)
    source = c.art.manifest.kernels[0]["source"]
    path = blob_path(root, source)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    path.write_bytes(bytes(raw))

    hit = precompile.standalone_compile(c.gm, c.inputs, cache=url)
    assert hit.source == "cache"
    assert_same_output(hit(*c.inputs), c.expected)
    errors = LocalCache(root).counters()["errors"]
    with pytest.raises(precompile.ArtifactNotFoundError, match=source[:12]):
        hit.save(tmp_path / "incomplete.pc")
    assert not (tmp_path / "incomplete.pc").exists()
    assert LocalCache(root).counters()["errors"] == errors + 1 and not path.exists()

    builds = LocalCache(root).counters()["builds"]
    art = precompile.standalone_compile(c.gm, c.inputs, cache=url)
    assert art.source == "compiled", "an entry with a lost part was served again"
    assert LocalCache(root).counters()["builds"] == builds + 1
    assert_same_output(art(*c.inputs), c.expected)
    again = precompile.standalone_compile(c.gm, c.inputs, cache=url)
    assert again.source == "cache"
    again.save(tmp_path / "complete.pc")  # every part is there again
    assert LocalCache(root).verify()["ok"]


# ------------------------------------------------------------------------------ bad files given to load
@pytest.fixture(scope="module")
def saved_binary(artifacts, tmp_path_factory) -> Path:
    return artifacts("make_fx").art.save(tmp_path_factory.mktemp("faults") / "art.pc")


@pytest.mark.parametrize("keep", ["0", "3", "10", "30", "half", "all-1"])
def test_truncated_artifact_file(keep, saved_binary, tmp_path):
    raw = saved_binary.read_bytes()
    n = {"half": len(raw) // 2, "all-1": len(raw) - 1}.get(keep) or int(keep)
    bad = tmp_path / "cut.pc"
    bad.write_bytes(raw[:n])
    with pytest.raises(ArtifactFormatError, match="truncated") as info:
        precompile.load(bad)
    assert str(bad) in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, precompile.PrecompileError)


def test_flipped_byte_in_artifact_file(saved_binary, tmp_path):
    raw = bytearray(saved_binary.read_bytes())
    raw[-200] ^= 0x01  # inside the last blob's zstd frame
    bad = tmp_path / "flipped.pc"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ArtifactFormatError, match="corrupt|does not decompress|does not match"):
        precompile.load(bad)


def _foreign_files(tmp_path: Path) -> dict[str, Path]:
    files = {}
    files["text"] = tmp_path / "notes.txt"
    files["text"].write_text("this is not an artifact\n" * 50)
    files["torch.save"] = tmp_path / "weights.pt"
    torch.save({"w": torch.ones(3)}, files["torch.save"])
    files["json"] = tmp_path / "manifest.json"
    files["json"].write_text(json.dumps({"schema": 1, "key": "0" * 64}))
    files["random"] = tmp_path / "random.bin"
    files["random"].write_bytes(os.urandom(4096))
    files["directory"] = tmp_path / "some-dir"
    files["directory"].mkdir()
    (files["directory"] / "readme.txt").write_text("hello")
    return files


def test_foreign_files(tmp_path):
    for what, path in _foreign_files(tmp_path).items():
        with pytest.raises(ArtifactFormatError, match="not a precompile artifact|not an unpacked precompile") as info:
            precompile.load(path)
        assert str(path) in str(info.value), what


def test_damaged_unpacked_directory(artifacts, tmp_path):
    d = artifacts("make_fx").art.save(tmp_path / "art.d", format="unpacked")
    kernel = next((d / "kernels").glob("*.cpp"))
    kernel.write_text(kernel.read_text() + "\n// edited\n")
    with pytest.raises(ArtifactFormatError, match="was modified"):
        precompile.load(d)
    kernel.unlink()
    with pytest.raises(ArtifactFormatError, match="is missing"):
        precompile.load(d)
    (d / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactFormatError, match="not valid JSON"):
        precompile.load(d)


def test_missing_path_or_key(tmp_path):
    with pytest.raises(precompile.ArtifactNotFoundError):
        precompile.load(tmp_path / "nothing-here.pc")
    with pytest.raises(FileNotFoundError):  # ArtifactNotFoundError is a FileNotFoundError too
        precompile.load("f" * 64, cache="file://" + str(tmp_path / "empty-cache"))


# ----------------------------------------------------------------------------------- wrong call inputs
@pytest.mark.parametrize("kind", ["dynamo", "export"])
def test_wrong_inputs_name_the_placeholder(kind, artifacts):
    c = artifacts(kind)
    art = c.art
    user_index = next(i for i, t in enumerate(c.inputs) if t.shape == (_graphs.BATCH, _graphs.D))
    name = next(s["name"] for s in art.placeholders if s["kind"] == "user_input")

    def call_with(x):
        args = list(c.inputs)
        args[user_index] = x
        return art(*args)

    cases = {
        "shape": torch.randn(_graphs.BATCH + 1, _graphs.D),
        "rank": torch.randn(_graphs.BATCH, _graphs.D, 1),
        "dtype": torch.randn(_graphs.BATCH, _graphs.D, dtype=torch.float64),
        "int dtype": torch.ones(_graphs.BATCH, _graphs.D, dtype=torch.int64),
        "stride": torch.randn(_graphs.D, _graphs.BATCH).t(),
        "not a tensor": 3.0,
    }
    for what, x in cases.items():
        with pytest.raises(InputMismatchError, match=name) as info:
            call_with(x)
        assert "expected tensor[4x16] float32 on cpu" in str(info.value), (what, str(info.value))
    with pytest.raises(InputMismatchError, match=name):  # a nested list where a tensor goes
        call_with([[0.0] * _graphs.D] * _graphs.BATCH)
    # number of inputs: too few and too many, each naming placeholders
    with pytest.raises(InputMismatchError, match="Missing placeholders") as info:
        art(*c.inputs[:-1])
    assert art.placeholders[-1]["name"] in str(info.value)
    with pytest.raises(InputMismatchError, match=f"got {len(c.inputs) + 1}") as info:
        art(*c.inputs, c.inputs[-1])
    assert name in str(info.value)
    with pytest.raises(TypeError):  # InputMismatchError is a TypeError too
        art()
    assert_same_output(art(*c.inputs), c.expected)  # nothing was left broken


# ---------------------------------------------------------------------------------- unserializable graphs
def _graph_calling(fn) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(torch.relu, (x,))
    z = graph.call_function(fn, (y,))
    graph.output((z,))
    return torch.fx.GraphModule(torch.nn.Module(), graph), [torch.randn(_graphs.BATCH, _graphs.D)]


class _Opaque:
    """A Python object in a node's arguments (as a custom backend or a hand-built graph may leave there)."""

    def __repr__(self) -> str:  # FX writes the graph's code with repr(); keep it valid Python
        return "Opaque()"


def _graph_with_opaque_argument() -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(torch.mul, (x, _Opaque()))
    graph.output((y,))
    return torch.fx.GraphModule(torch.nn.Module(), graph), [torch.randn(_graphs.BATCH, _graphs.D)]


def test_unserializable_graph_names_the_node_and_writes_nothing(tmp_path):
    def local_double(t):
        return t * 2

    cases = {
        "lambda": (_graph_calling(lambda t: t + 1), "<lambda>"),
        "local function": (_graph_calling(local_double), "local_double"),
        "opaque argument": (_graph_with_opaque_argument(), "_Opaque"),
    }
    root = tmp_path / "cache"
    for what, ((gm, inputs), shown) in cases.items():
        node = [n.name for n in gm.graph.nodes if n.op == "call_function"][-1]
        with pytest.raises(UnserializableGraphError, match=node) as info:
            precompile.standalone_compile(gm, inputs, cache="file://" + str(root))
        assert shown in str(info.value), (what, str(info.value))
        assert isinstance(info.value, TypeError)
        with pytest.raises(UnserializableGraphError):
            precompile.standalone_compile(gm, inputs)  # without a cache too
    # nothing written: no refs, no blobs
    if root.exists():
        cache = LocalCache(root)
        assert list(cache.iter_refs()) == [] and cache.size_bytes() == 0
        assert not [p for p in (root / "blob").rglob("*") if p.is_file()]


# ------------------------------------------------------------------------------------------ read-only cache
def test_read_only_cache_url(artifacts, cache_copy, caplog):
    """``file:///dir?read_only=1``: a hit still loads; a miss compiles, returns correct output, stores nothing,
    and the failed store is logged once for the cache, not once per artifact."""
    c = artifacts("dynamo")
    root = cache_copy()
    url = f"file://{root}?read_only=1"
    before = tree(root)
    with caplog.at_level(logging.INFO, logger="precompile"):
        hit = precompile.standalone_compile(c.gm, c.inputs, cache=url)
        assert hit.source == "cache"
        assert_same_output(hit(*c.inputs), c.expected)
        warned = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("precompile")]
        assert warned == [], [r.getMessage() for r in warned]

        model = _graphs.mlp()
        for batch in (_graphs.BATCH + 2, _graphs.BATCH + 3):
            x = _graphs.example(batch=batch)
            gm, inputs = _graphs.graph("make_fx", model, x)
            cache = precompile.open_cache(url)
            start = cache.counters()
            art = precompile.standalone_compile(gm, inputs, cache=cache)
            assert art.source == "compiled"
            with torch.no_grad():
                assert_same_output(art(*inputs), gm(*inputs))
            counters = cache.counters()  # kept in memory: the directory is not touched
            delta = {k: counters[k] - start[k] for k in ("builds", "errors", "misses", "hits")}
            assert delta == {"builds": 1, "errors": 1, "misses": 1, "hits": 0}, delta
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("precompile")]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    msg = warned[0].getMessage()
    assert warned[0].name.startswith("precompile") and "could not store" in msg and "read-only" in msg, msg
    assert tree(root) == before, "a read-only cache directory was modified"


READ_ONLY_SNIPPET = r"""
import json, logging, sys, torch, precompile, _graphs
logging.basicConfig(level=logging.WARNING, format="LOG %(levelname)s %(name)s %(message)s")
url, out_path = sys.argv[1:3]
model = _graphs.mlp()
outs, sources = [], []
for batch in (2, 3):
    gm, inputs = _graphs.graph("export", model, _graphs.example(batch=batch))
    art = precompile.standalone_compile(gm, inputs, cache=url)
    sources.append(art.source)
    outs.append((art(*inputs), model(*inputs)))
    print(f"LOG MARK call {batch} done", file=sys.stderr, flush=True)
torch.save(outs, out_path)
print(json.dumps({"sources": sources}))
"""


@pytest.mark.slow
def test_read_only_directory(tmp_path):
    """A cache directory this process may not write (mode 0o555, CAP_DAC_OVERRIDE dropped when root): compiles
    still work, and the failure is reported once, not on every compile."""
    prefix = without_root_powers()
    if prefix is None:
        pytest.skip("running as root without a working setpriv: chmod 0o555 does not stop root from writing, so a "
                    "real read-only directory cannot be made here (the read_only=1 URL is tested separately)")
    root = tmp_path / "ro-cache"
    LocalCache(root).incr(hits=0)  # creates blob/, ref/, locks/, tmp/
    dirs = [d for d in [root, *root.rglob("*")] if d.is_dir()]
    before = tree(root)
    for d in dirs:
        d.chmod(0o555)
    try:
        proc = spawn_python(READ_ONLY_SNIPPET, "file://" + str(root), str(tmp_path / "out.pt"), prefix=prefix)
        report = proc.json()
    finally:
        for d in dirs:
            d.chmod(0o755)
    assert report["sources"] == ["compiled", "compiled"]
    for got, want in torch.load(tmp_path / "out.pt", weights_only=False):
        assert_same_output(got, want)
    logs = [line for line in proc.stderr.splitlines() if line.startswith("LOG ")]
    split = logs.index("LOG MARK call 2 done")  # the first compile (batch 2) is done
    warnings = [line for line in logs if line.startswith("LOG WARNING precompile")]
    assert warnings, "the failure to store was not reported"
    assert len(set(warnings)) == len(warnings), "a warning was repeated:\n" + "\n".join(warnings)
    assert sum("could not store" in w for w in warnings) == 1, "\n".join(warnings)
    assert all("read-only" in w or "cannot persist cache counters" in w for w in warnings), "\n".join(warnings)
    second = [line for line in logs[split + 1:] if line.startswith("LOG WARNING precompile")]
    assert second == [], "the second compile reported the read-only cache again:\n" + "\n".join(second)
    assert tree(root) == before, "the read-only directory was modified"


# --------------------------------------------------------------------------------------------- concurrency
CONCURRENT_SNIPPET = r"""
import json, os, sys, time, torch, precompile, _graphs
url, go, out_path = sys.argv[1:4]
model = _graphs.mlp()
gm, inputs = _graphs.graph("export", model, _graphs.example(batch=6))
deadline = time.monotonic() + 120
while not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit("the go file never appeared")
    time.sleep(0.01)
art = precompile.standalone_compile(gm, inputs, cache=url)
torch.save({"got": art(*inputs), "want": model(*inputs)}, out_path)
print(json.dumps({"key": art.key, "source": art.source}))
"""


@pytest.mark.slow
def test_concurrent_builds_into_one_cache(tmp_path):
    """Three processes get-or-build the same graph into one local cache at the same moment."""
    root = tmp_path / "shared-cache"
    go = tmp_path / "go"
    url = "file://" + str(root)
    # Inductor's CPU ISA probe (gcc + dlopen of test programs, ~15 s per fresh process) is not what this tests:
    # trust the ISA the CPU reports, so that three first compiles fit on a 2-core runner
    env = {"TORCHINDUCTOR_VEC_ISA_OK": "1"}
    procs = [spawn_python(CONCURRENT_SNIPPET, url, str(go), str(tmp_path / f"out{i}.pt"), env=env)
             for i in range(3)]
    time.sleep(1.0)
    go.touch()
    reports = [p.json() for p in procs]
    keys = {r["key"] for r in reports}
    assert len(keys) == 1
    for i in range(3):
        out = torch.load(tmp_path / f"out{i}.pt", weights_only=False)
        assert_same_output(out["got"], out["want"], where=f"process {i}")
    cache = LocalCache(root)
    report = cache.verify()
    assert report["ok"], report
    refs = dict(cache.iter_refs())
    assert list(refs) == list(keys), refs
    counters = cache.counters()
    assert counters["builds"] + counters["hits"] == 3 and counters["errors"] == 0, counters
    assert counters["builds"] == sum(r["source"] == "compiled" for r in reports)
    assert not list(root.rglob("*.incomplete"))
    art = precompile.load(next(iter(keys)), cache=url, weights=_graphs.mlp())
    out = torch.load(tmp_path / "out0.pt", weights_only=False)
    assert_same_output(art(_graphs.example(batch=6)), out["want"])


# ------------------------------------------------------------------- Redis faults (issue 10, findings 5-8)
HITS_SNIPPET = r"""
import json, logging, sys, time, torch, precompile, _graphs
logging.basicConfig(level=logging.WARNING, format="LOG %(levelname)s %(name)s %(message)s")
url, n, pause_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
model = _graphs.mlp()
gm, inputs = _graphs.graph("make_fx", model)
with torch.no_grad():
    want = gm(*inputs)
out = []
for i in range(n):
    if i:
        time.sleep(pause_s)
    start = time.monotonic()
    art = precompile.standalone_compile(gm, inputs, cache=url)
    got = art(*inputs)
    out.append({"s": time.monotonic() - start, "source": art.source,
                "ok": all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want))})
print(json.dumps(out))
"""


def _flip_chunked_heads(client) -> int:
    """Flip the top bit of the chunk count and of the stored length of every chunked head; returns how many."""
    import struct

    n = 0
    for key in client.keys("precompile:blob:*"):
        head = client.get(key)
        if head and head[:5] in (b"PCB1C", b"PCB1K") and len(head) == 17:
            count, total = struct.unpack_from("<IQ", head, 5)
            client.set(key, head[:5] + struct.pack("<IQ", count ^ (1 << 31), total ^ (1 << 40)))
            n += 1
    return n


def test_flipped_chunk_count_is_a_miss_not_a_memory_error(artifacts, redis_server):
    """Finding 5: a bit flipped in a chunked head's count (and length) used to make get_blob build a list of
    two billion batches (MemoryError, worker exit 1).  Now: a miss, the blob dropped, a rebuild, in a real
    process, fast."""
    c = artifacts("make_fx")
    url = redis_server.url(chunk_size="4KiB")
    from precompile.cache_io import store

    assert store(precompile.open_cache(url), c.art)
    assert _flip_chunked_heads(redis_server.client()) >= 1
    proc = spawn_python(HITS_SNIPPET, url, "2", "0")
    first, second = proc.json()
    assert first["ok"] and second["ok"], (first, second)
    assert first["source"] == "compiled" and second["source"] == "cache"  # rebuilt once, then served
    assert "dropping it" in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr[-3000:]
    counters = precompile.open_cache(url).counters()
    assert counters["errors"] >= 1 and counters["builds"] == 1, counters


def test_stalled_redis_never_slows_a_local_hit(artifacts, tmp_path, redis_server):
    """Finding 6: with counters=1 (deploy/serving-worker.yaml), a hit served by the near tier used to send its
    counters to Redis on the call path: two timeouts per hit once the breaker had expired.  Counters now go off
    the call path: every hit is as fast with Redis SIGSTOPped as without."""
    c = artifacts("make_fx")
    from precompile.cache_io import store

    assert store(precompile.open_cache(f"file://{tmp_path / 'near'}|{redis_server.url()}"), c.art)
    url = f"file://{tmp_path / 'near'}|{redis_server.url(read_only=1, counters=1, timeout=2, down_s=1)}"
    redis_server.pause()
    try:
        proc = spawn_python(HITS_SNIPPET, url, "4", "1.5")
        hits = proc.json()
    finally:
        redis_server.resume()
    assert all(h["ok"] and h["source"] == "cache" for h in hits), hits
    # none waits for Redis (one timeout is 2 s; the first hit also pays the first fast load's set-up)
    assert max(h["s"] for h in hits[1:]) < 1.0 and hits[0]["s"] < 2.0, [round(h["s"], 3) for h in hits]


def test_stalled_redis_costs_one_timeout_then_is_skipped(redis_server):
    """Finding 7: redis-py retried a timed-out command, so a stalled server cost two timeouts.  Now one, and
    every cache of the process on that server then fails fast while it is down."""
    from cache_backends.redis_cache import RedisCache
    from precompile.errors import CacheUnavailableError

    url = redis_server.url(timeout=1, down_s=30)
    digest = precompile.open_cache(url).put_blob(b"part")
    redis_server.pause()
    try:
        start = time.monotonic()
        with pytest.raises(CacheUnavailableError, match="Timeout"):
            precompile.open_cache(url).get_blob(digest)
        one = time.monotonic() - start
        start = time.monotonic()
        with pytest.raises(CacheUnavailableError, match="not retrying"):
            RedisCache.from_url(url).get_ref("0" * 64)  # a new cache of the same server: skipped
        skipped = time.monotonic() - start
    finally:
        redis_server.resume()
    assert 0.9 < one < 1.6, one
    assert skipped < 0.1, skipped


def test_transient_remote_error_during_a_load_drops_nothing(artifacts, tmp_path, redis_server):
    """Finding 8: a remote read that timed out used to look like a missing part, and the load then deleted the
    intact remote ref for the whole fleet.  Now it is a miss (one timeout, counted), and both refs stay."""
    from precompile.cache_io import load_from_cache, store

    c = artifacts("make_fx")
    url = f"file://{tmp_path / 'near'}|{redis_server.url(timeout=1, down_s=0)}"
    assert store(precompile.open_cache(url), c.art)
    near = LocalCache(tmp_path / "near")
    needed = c.art.manifest.load_digests()[0]
    blob_path(tmp_path / "near", needed).unlink()  # evicted here: the load must read it from Redis
    redis_server.pause()
    try:
        start = time.monotonic()
        assert load_from_cache(c.art.key, url) is None
        took = time.monotonic() - start
    finally:
        redis_server.resume()
    assert took < 1.6, took
    assert redis_server.client().exists(f"precompile:ref:{c.art.key}"), "the remote ref was dropped"
    assert near.get_ref(c.art.key), "the near ref was dropped"
    assert near.counters()["errors"] >= 1 and near.counters()["remote_errors"] >= 1
    art = load_from_cache(c.art.key, url)  # Redis answers again: a hit, the part fetched again
    assert art is not None
    assert_same_output(art(*c.inputs), c.expected)
